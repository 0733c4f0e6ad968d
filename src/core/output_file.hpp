// Internal: the one way qkv writes a file (weights, checkpoints, tokenizers, embeddings, the
// inspect page and its PNGs, loss curves): never half a file at the final path.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace qkv::detail {

// Writes the concatenation of `pieces` to a temporary "<path>.tmp.<pid>.<n>" (unique per process
// and write, opened O_EXCL), fsyncs it and renames it over `path`, so a reader or a crash sees the
// old file or the new one. Any failure removes the temporary and throws qkv::IoError
// "[fn] arg 'path': what failed: errno's text (the temporary was removed)".
void write_file_atomic(const std::string& path, std::span<const std::string_view> pieces, std::string_view fn,
                       std::string_view arg = "path");
inline void write_file_atomic(const std::string& path, std::string_view bytes, std::string_view fn,
                              std::string_view arg = "path") {
  write_file_atomic(path, std::span<const std::string_view>(&bytes, 1), fn, arg);
}

}  // namespace qkv::detail
