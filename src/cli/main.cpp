// qkv — the command-line face of the library. It parses, calls a lower floor, and prints.
// Every error ends the program with one line "qkv: error: …" on stderr and an exit code by its
// kind (qkv/types.hpp): 2 for a usage error (unknown command or option, bad value), 3 for an I/O
// failure (qkv::IoError), 4 for a corrupt file (qkv::FormatError), 5 for a run whose numbers became
// non-finite (qkv::NonFiniteError), 1 for anything else. A command that stops early without an
// error may set another status (commands.hpp: exit_status). app.cpp's footer documents them.
#include <cstring>
#include <exception>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "qkv/runtime.hpp"
#include "qkv/types.hpp"

namespace {

// Error texts may span lines (CLI11 lists choices that way); the contract is one line.
std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string command_list(const CLI::App& app) {
  std::string all;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    all += (all.empty() ? "" : ", ") + sub->get_name();
  return all;
}

// The first word that is not an option of qkv itself (`qkv --threads 2 NAME ...`), or "" when
// there is none. CLI11 would report a misspelt command as "A subcommand is required".
// Options of qkv itself; anything else starting with '-' before the command is unknown.
std::string command_word(int argc, char** argv, std::string* unknown_option) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads") {
      ++i;  // its value
      continue;
    }
    if (a.rfind("--threads=", 0) == 0) continue;
    if (a == "-h" || a == "--help" || a == "--help-all" || a == "--version") return "";
    if (!a.empty() && a[0] == '-') {
      *unknown_option = a;
      return "";
    }
    return a;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app;
  qkv::cli::build_app(app);

  // qkv help [command]: the help of qkv, or of one command.
  auto help_topic = std::make_shared<std::string>();
  CLI::App* help = app.add_subcommand("help", "print the help of qkv, or of one command: qkv help generate");
  help->add_option("command", *help_topic, "the command to explain");
  help->footer("");  // a subcommand copies its parent's footer: qkv's exit codes belong to qkv --help
  help->callback([&app, help_topic] {
    // The formatter directly: App::help() would print the help of the command parsed, `help`.
    if (help_topic->empty()) {
      std::cout << app.get_formatter()->make_help(&app, "qkv", CLI::AppFormatMode::Normal);
      return;
    }
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
      if (sub->get_name() == *help_topic) {
        std::cout << sub->get_formatter()->make_help(sub, "qkv " + sub->get_name(), CLI::AppFormatMode::Normal);
        return;
      }
    throw CLI::ValidationError("qkv help: unknown command '" + *help_topic + "'; the commands are: " + command_list(app));
  });

  try {
    // QKV_NUM_THREADS and QKV_ISA are read now, so a bad value is refused before any work
    // (--threads, parsed below, still overrides a good QKV_NUM_THREADS).
    qkv::num_threads();
    qkv::active_isa();
    std::string unknown_option;
    const std::string word = command_word(argc, argv, &unknown_option);
    if (!unknown_option.empty()) {
      std::cerr << "qkv: error: unknown option '" << unknown_option
                << "'; qkv's own options are --threads, --version and --help, and a command comes next: "
                << command_list(app) << "\n";
      return 2;
    }
    if (!word.empty()) {
      bool known = false;
      for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
        known = known || sub->get_name() == word;
      if (!known) {
        std::cerr << "qkv: error: unknown command '" << word << "'; the commands are: " << command_list(app)
                  << " (run 'qkv --help')\n";
        return 2;
      }
    }
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ExtrasError& e) {
    // Options or arguments the command does not take: name the command and where its help is.
    const auto parsed = app.get_subcommands();
    const std::string cmd = parsed.empty() ? "" : parsed.back()->get_name();
    std::cerr << "qkv: error: " << (cmd.empty() ? "" : "qkv " + cmd + ": ") << one_line(e.what())
              << " (run 'qkv help" << (cmd.empty() ? "" : " " + cmd) << "')\n";
    return 2;
  } catch (const CLI::ParseError& e) {
    std::cerr << "qkv: error: " << one_line(e.what()) << " (run 'qkv --help')\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "qkv: error: out of memory (the sizes asked for need more memory than this machine gives)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "qkv: error: " << one_line(e.what()) << "\n";
    if (dynamic_cast<const qkv::IoError*>(&e)) return 3;
    if (dynamic_cast<const qkv::FormatError*>(&e)) return 4;
    if (dynamic_cast<const qkv::NonFiniteError*>(&e)) return 5;
    return 1;
  }
  return qkv::cli::exit_status();
}
