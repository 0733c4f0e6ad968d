// What several commands share for scripts: text input from a file or stdin (`--input -`,
// `--prompt -`, `--batch-file -`), one JSON document on stdout (`--json`), and where the default
// model is found.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace qkv::cli {

// The text a command's input flag names: all of stdin when `path` is "-", else the file `path`
// (checked first by check_input, so a FIFO is refused rather than blocking). It must be UTF-8: an
// error names `command`, `flag`, the source, the line, the character and the byte.
std::string read_text_input(const char* command, const std::string& flag, const std::string& path);

// read_text_input() split into lines: "\n" ends a line, a "\r" before it is dropped, a last line
// without "\n" counts, an empty line is kept (as the empty text).
std::vector<std::string> read_lines(const char* command, const std::string& flag, const std::string& path);

// When `value` is "-", replaces it with read_text_input(…, "-") less one final "\n" or "\r\n", so
// `echo TEXT | qkv … --prompt -` runs TEXT exactly as `--prompt TEXT` does. Any other value is left
// as it is (it is the text itself, not a path).
void read_if_stdin(const char* command, const std::string& flag, std::string& value);

// Prints `doc` as the one JSON document on stdout (2-space indent, a final newline). Bytes that
// are not UTF-8 (a byte-fallback token cut from its character) are written as U+FFFD.
void print_json(const nlohmann::json& doc);

// A float option's value for a JSON document as it was typed: the double with the float's
// shortest decimal form (0.8f gives 0.8, not 0.800000011920929).
double json_number(float v);

// The folder of the stories260K model (stories260K.bin, tok512.bin) that ships with qkv, found
// relative to the running binary, never by a source-tree path: the installed copy,
// share/qkv/models/stories260K/ in the folder above the binary's (cmake --install's bin/ and
// share/, or the prefix of the environment pip installed into), else the build tree's copy in
// share/qkv/... beside the binary. Throws, naming `command`, the places it looked and `remedy`
// ("give --model, or set QKV_MODEL").
std::string shipped_model_dir(const char* command, const std::string& remedy);

// The model `qkv generate` and `qkv inspect` run when --model is not given: the environment
// variable QKV_MODEL when set, else shipped_model_dir()/stories260K.bin.
std::string default_model(const char* command);

}  // namespace qkv::cli
