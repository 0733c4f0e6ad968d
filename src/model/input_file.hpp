// Internal: opening a file a user named, with the checks every reader makes first (the model and
// config loaders, the tokenizer, the training corpus and checkpoint, the CLI's --config).
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <string_view>

namespace qkv::detail {

// Why `path` cannot be read as a regular file ("no such file or directory", "is a directory",
// "is a FIFO, not a regular file", "is a character device, not a regular file", "permission
// denied", ...), or "" when it is a regular file this process may open. Uses stat(), which never
// blocks, so a FIFO is refused before anyone opens it.
std::string input_file_problem(const std::string& path);

// Opens `path` read-only after input_file_problem() and returns the descriptor (the caller closes
// it). Errors read "[fn] arg 'path': reason". The open is O_NONBLOCK too, and fstat() confirms a
// regular file, so a path swapped for a FIFO between the two checks cannot block either.
int open_input_file(const std::string& path, std::string_view fn, std::string_view arg);

// The whole file through open_input_file(); a file larger than max_bytes is refused (naming the
// limit), a read error names errno's text.
std::string read_input_file(const std::string& path, std::string_view fn, std::string_view arg,
                            std::size_t max_bytes = std::numeric_limits<std::size_t>::max());

// The tokenizer of `model` (a file, or a folder as `qkv train` and save_pretrained write) when none
// is given: in the model's folder, tokenizer.json (qkv train's, or a Hugging Face one), else
// tokenizer.bin, else GPT-2's vocab.json (with merges.txt), else the one tok*.bin (llama2.c names it
// tok<V>.bin); "" if there is none. Several
// tok*.bin are an error "[fn] arg: not given, and DIR holds several tok*.bin". Tokenizer::load then
// tells the format by content. Used by qkv generate / inspect / train and qkv.inspect.
std::string tokenizer_beside(const std::string& model, std::string_view fn, std::string_view arg);

}  // namespace qkv::detail
