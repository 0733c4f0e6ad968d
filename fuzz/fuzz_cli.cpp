// libFuzzer harness: the argument parser of the qkv command. The input is split at newlines into
// argv words (argv[0] is "qkv"); the app is the real one (qkv::cli::build_app: the same options,
// validators and subcommands as the installed tool) with every subcommand's action switched off,
// so only the parse runs: nothing trains, generates or writes files. A parse must succeed with
// exactly one subcommand chosen, or end in CLI11's ParseError family (usage errors, --help,
// --version), the only exceptions main() turns into exit code 0 or 2. Anything else escaping
// (or a crash inside CLI11 or a validator) is a finding.
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.hpp"

namespace {

// A subcommand's action is its CLI11 callback, and that callback also owns the variables its
// options write to (a shared_ptr captured by the lambda). So the actions are moved out into a list
// that lives as long as the app, never called, rather than replaced (replacing them freed the
// variables the options then wrote to: a use-after-free of the harness, not of qkv). CLI11 has no getter for them: they are protected members of
// CLI::App, reached through pointers to members taken in a derived class.
struct ActionOf : CLI::App {
  static constexpr auto final_cb = &ActionOf::final_callback_;
  static constexpr auto parse_complete = &ActionOf::parse_complete_callback_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> words{"qkv"};
  std::string word;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      words.push_back(word);
      word.clear();
    } else {
      word += static_cast<char>(data[i]);
    }
  }
  if (!word.empty()) words.push_back(word);
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());

  // Built once: CLI11 clears every option's results before a parse, so each input is parsed as by
  // a fresh app (only the values bound to options persist, and nothing reads them here).
  static CLI::App& app = []() -> CLI::App& {
    static CLI::App a;
    static std::vector<std::function<void()>> actions;
    qkv::cli::build_app(a);
    for (CLI::App* sub : a.get_subcommands(std::function<bool(CLI::App*)>{})) {
      actions.push_back(std::exchange(sub->*ActionOf::final_cb, {}));
      actions.push_back(std::exchange(sub->*ActionOf::parse_complete, {}));
    }
    return a;
  }();
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError&) {
    return 0;
  }
  if (app.get_subcommands().size() != 1) __builtin_trap();
  return 0;
}
