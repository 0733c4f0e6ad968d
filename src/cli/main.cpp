// qkv — the command-line face of the library. It parses, calls a lower floor, and prints.
// Every error ends the program with one line "qkv: error: …" on stderr: exit code 2 for a usage
// error (unknown option, bad value), 1 for anything else.
#include <exception>
#include <iostream>
#include <new>
#include <string>

#include "cli/commands.hpp"

namespace {

// Error texts may span lines (CLI11 lists choices that way); the contract is one line.
std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app;
  qkv::cli::build_app(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "qkv: error: " << one_line(e.what()) << " (run 'qkv --help')\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "qkv: error: out of memory (the sizes asked for need more memory than this machine gives)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "qkv: error: " << one_line(e.what()) << "\n";
    return 1;
  }
  return 0;
}
