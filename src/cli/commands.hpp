// The subcommands of the qkv tool. Adding one, `qkv NAME`:
//   1. write src/cli/cmd_NAME.cpp defining `void qkv::cli::add_NAME(CLI::App& app)`, which creates the
//      subcommand, its options, and a callback that does the work (throwing on any error);
//   2. add one line `X(NAME)` to QKV_CLI_COMMANDS below.
// src/cli/CMakeLists.txt picks up every cmd_*.cpp by itself.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "model/input_file.hpp"
#include "qkv/types.hpp"

#define QKV_CLI_COMMANDS(X) \
  X(params)                 \
  X(attend)                 \
  X(train)                  \
  X(inspect)                \
  X(generate)               \
  X(completion)             \
  X(embed)

namespace qkv::cli {

// A validator for integer options that must be ≥ lo, with a short message ("must be ≥ 1").
inline CLI::Validator at_least(long long lo) {
  return CLI::Validator(
      [lo](std::string& text) -> std::string {
        long long v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return "'" + text + "' is not an integer";
        if (v < lo) return "must be >= " + std::to_string(lo) + " (got " + text + ")";
        return {};
      },
      "INT>=" + std::to_string(lo));
}

// Refuses `path`, given to `command` as `flag`, unless it is a regular file this process may read
// (or, with allow_folder, a folder): "qkv generate: --model 'x': is a FIFO, not a regular file".
// Checked with stat(), so a FIFO or device is named before anything would block opening it.
inline void check_input(const char* command, const std::string& flag, const std::string& path, bool allow_folder = false) {
  if (allow_folder && std::filesystem::is_directory(path)) return;
  if (const std::string why = detail::input_file_problem(path); !why.empty())
    fail(command, flag + " '" + path + "': " + why);
}

// The exit status of a command that finished without an error but must not report success (a
// training run stopped by a signal exits 128 + its number, as a shell reports it). main returns it.
inline int& exit_status() {
  static int status = 0;
  return status;
}

// A validator for the value of a flag given as --flag=VALUE (true/false, on/off, yes/no, an
// integer). CLI11 2.1.2 converts the value of an add_flag_function flag with std::stoll, whose
// std::invalid_argument escaped its usage errors: `qkv params --bias=foo` printed "qkv: error:
// stoll" with exit code 1 (found by fuzz/fuzz_cli.cpp). Checked first, it is a usage error (2).
inline CLI::Validator flag_value() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          CLI::detail::to_flag_value(text);
        } catch (const std::exception&) {
          return "'" + text + "' is not a flag value (true/false, on/off, yes/no or an integer)";
        }
        return {};
      },
      "");
}

// A flag and its negation as two options, NAME and NEGATION ("--bias", "--no-bias"), each taking an
// optional flag value checked by flag_value(); set(on) runs as each one is parsed, so the last one
// given wins. Not CLI11's "--bias,!--no-bias": CLI11 2.1.2 converts a value given to the negated
// name with std::stoll while parsing, before any validator, and catches only invalid_argument, so
// `qkv params --no-bias=99999999999999999999` escaped as std::out_of_range ("qkv: error: stoll",
// exit 1; found by fuzz/fuzz_cli.cpp, docs/fuzzing.md finding 5).
inline void add_flag_pair(CLI::App* cmd, const std::string& name, const std::string& negation,
                          std::function<void(bool)> set, const std::string& help) {
  cmd->add_flag_function(name, [set](std::int64_t n) { set(n > 0); }, help)->check(flag_value())->trigger_on_parse();
  cmd->add_flag_function(negation, [set](std::int64_t n) { set(n <= 0); }, "the opposite of " + name)
      ->check(flag_value())
      ->trigger_on_parse();
}

#define QKV_CLI_DECLARE(name) void add_##name(CLI::App& app);
QKV_CLI_COMMANDS(QKV_CLI_DECLARE)
#undef QKV_CLI_DECLARE

// The whole qkv app (src/cli/app.cpp): top-level options, then add_NAME for every command above.
void build_app(CLI::App& app);

}  // namespace qkv::cli
