#include "cli/io.hpp"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <system_error>

#include "cli/commands.hpp"
#include "model/unicode.hpp"
#include "qkv/types.hpp"

namespace qkv::cli {

std::string read_text_input(const char* command, const std::string& flag, const std::string& path) {
  std::string text, source;
  if (path == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    if (std::cin.bad()) fail_io(command, flag + " -: reading stdin failed");
    source = flag + " -: stdin";
  } else {
    check_input(command, flag, path);
    text = detail::read_input_file(path, command, flag);
    source = flag + " '" + path + "'";
  }
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < text.size();) {
    char32_t cp;
    const auto n = static_cast<std::size_t>(detail::unicode::utf8_next(text, i, &cp));
    if (n == 0) {
      char byte[8];
      std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned char>(text[i]));
      fail(command, source + " is not UTF-8: line " + std::to_string(line) + ", character " + std::to_string(column) +
                        " starts with the byte " + byte);
    }
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
    i += n;
  }
  return text;
}

std::vector<std::string> read_lines(const char* command, const std::string& flag, const std::string& path) {
  const std::string text = read_text_input(command, flag, path);
  std::vector<std::string> lines;
  for (std::size_t at = 0; at < text.size();) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    if (line.ends_with('\r')) line.pop_back();
    lines.push_back(std::move(line));
    at = end + 1;
  }
  return lines;
}

void read_if_stdin(const char* command, const std::string& flag, std::string& value) {
  if (value != "-") return;
  std::string text = read_text_input(command, flag, "-");
  if (text.ends_with("\r\n")) {
    text.resize(text.size() - 2);
  } else if (text.ends_with('\n')) {
    text.pop_back();
  }
  value = std::move(text);
}

void print_json(const nlohmann::json& doc) {
  std::cout << doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  std::cout.flush();
}

double json_number(float v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}

std::string shipped_model_dir(const char* command, const std::string& remedy) {
  namespace fs = std::filesystem;
  const fs::path rel = fs::path("share") / "qkv" / "models" / "stories260K";
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) fail(command, "the qkv binary cannot find its own folder (/proc/self/exe: " + ec.message() +
                        ") to look for the stories260K that ships with it; " + remedy);
  std::string looked;
  for (const fs::path& dir : {exe.parent_path().parent_path() / rel, exe.parent_path() / rel}) {
    if (fs::is_regular_file(dir / "stories260K.bin", ec)) return dir.string();
    looked += (looked.empty() ? "" : ", ") + (dir / "stories260K.bin").string();
  }
  fail(command, "the stories260K that ships with qkv is not installed (looked for " + looked + "); " + remedy);
}

std::string default_model(const char* command) {
  if (const char* env = std::getenv("QKV_MODEL"); env != nullptr && *env != '\0') return env;
  return (std::filesystem::path(shipped_model_dir(command, "give --model, or set QKV_MODEL")) / "stories260K.bin").string();
}

}  // namespace qkv::cli
