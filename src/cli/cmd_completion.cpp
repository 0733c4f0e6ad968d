// qkv completion — a shell completion script for qkv, written from the app's own commands and
// options (walked in CLI11 when the command runs), so it lists whatever this binary accepts.
//
//   source <(qkv completion bash)         (or save it as ~/.local/share/bash-completion/completions/qkv)
//   source <(qkv completion zsh)          (zsh runs the same function through its bashcompinit)
//
// What it completes: the command names after `qkv`; each command's options after a '-'; the values
// of an option with a fixed set of choices (--weights f32|bf16, a positional such as `completion
// bash|zsh`, the command named by `help`); file names for any other option's value (the script is
// registered with `complete -o default`, which falls back to them when it offers nothing).
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "qkv/version.hpp"

namespace qkv::cli {
namespace {

std::vector<const CLI::App*> subcommands(const CLI::App& app) {
  std::vector<const CLI::App*> all;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) all.push_back(sub);
  return all;
}

std::string join(const std::vector<std::string>& words, const char* sep) {
  std::string s;
  for (const std::string& w : words) s += (s.empty() ? "" : sep) + w;
  return s;
}

// The choices of a CLI::IsMember validator as its type name shows them ("TEXT:{f32,bf16}"), or
// none when the option has no such validator.
std::vector<std::string> choices(const CLI::Option& opt) {
  const std::string type = opt.get_type_name();
  const std::size_t open = type.find(":{"), close = type.rfind('}');
  std::vector<std::string> out;
  if (open == std::string::npos || close == std::string::npos || close < open) return out;
  std::istringstream list(type.substr(open + 2, close - open - 2));
  for (std::string w; std::getline(list, w, ',');) out.push_back(w);
  return out;
}

// One `case $cmd in` branch: what to offer after the command `label` (the root app: '').
void branch(std::ostream& s, const std::string& label, const CLI::App& app) {
  std::vector<std::string> words, positional_choices;
  std::ostringstream values;  // `case $prev in` lines for options that take a value
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->get_positional()) {
      // `qkv help COMMAND`: the positional names one of the root's commands.
      const bool names_command = opt->get_name() == "command" && app.get_parent() != nullptr;
      for (const std::string& c : names_command ? std::vector<std::string>{} : choices(*opt)) positional_choices.push_back(c);
      if (names_command)
        for (const CLI::App* sub : subcommands(*app.get_parent())) positional_choices.push_back(sub->get_name());
      continue;
    }
    std::vector<std::string> names;
    for (const std::string& n : opt->get_lnames()) names.push_back("--" + n);
    for (const std::string& n : opt->get_snames()) names.push_back("-" + n);
    words.insert(words.end(), names.begin(), names.end());
    if (opt->get_expected_max() == 0) continue;  // a flag: no value follows
    const std::vector<std::string> c = choices(*opt);
    values << "        " << join(names, "|") << ") "
           << (c.empty() ? "return ;;  # a value: the shell offers file names\n"
                         : "COMPREPLY=($(compgen -W '" + join(c, " ") + "' -- \"$cur\")); return ;;\n");
  }
  if (app.get_parent() == nullptr)
    for (const CLI::App* sub : subcommands(app)) positional_choices.push_back(sub->get_name());
  s << "    " << label << ")\n";
  if (!values.str().empty()) s << "      case $prev in\n" << values.str() << "      esac\n";
  if (positional_choices.empty()) {
    s << "      COMPREPLY=($(compgen -W '" << join(words, " ") << "' -- \"$cur\")) ;;\n";
  } else {
    s << "      if [[ $cur == -* ]]; then\n"
      << "        COMPREPLY=($(compgen -W '" << join(words, " ") << "' -- \"$cur\"))\n"
      << "      else\n"
      << "        COMPREPLY=($(compgen -W '" << join(positional_choices, " ") << "' -- \"$cur\"))\n"
      << "      fi ;;\n";
  }
}

// The bash function _qkv and its registration; zsh runs it through bashcompinit.
std::string script(const CLI::App& root, const std::string& shell) {
  std::vector<std::string> root_value_options;
  for (const CLI::Option* opt : root.get_options())
    if (!opt->get_positional() && opt->get_expected_max() != 0)
      for (const std::string& n : opt->get_lnames()) root_value_options.push_back("--" + n);
  std::ostringstream s;
  if (shell == "zsh") s << "#compdef qkv\n";
  s << "# " << shell << " completion for qkv " QKV_VERSION ", written by `qkv completion " << shell
    << "` from the commands and options of the binary.\n";
  if (shell == "zsh") s << "autoload -U +X bashcompinit && bashcompinit\n";
  s << "_qkv() {\n"
    << "  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} cmd= i\n"
    << "  # The command is the first word that is neither an option of qkv nor its value.\n"
    << "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
    << "    case ${COMP_WORDS[i]} in\n";
  if (!root_value_options.empty()) s << "      " << join(root_value_options, "|") << ") ((i++)) ;;\n";
  s << "      -*) ;;\n"
    << "      *) cmd=${COMP_WORDS[i]}; break ;;\n"
    << "    esac\n"
    << "  done\n"
    << "  case $cmd in\n";
  branch(s, "''", root);
  for (const CLI::App* sub : subcommands(root)) branch(s, sub->get_name(), *sub);
  s << "  esac\n"
    << "}\n"
    << "complete -o default -F _qkv qkv\n";
  return s.str();
}

}  // namespace

void add_completion(CLI::App& app) {
  auto shell = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("completion", "print a shell completion script: source <(qkv completion bash)");
  cmd->add_option("shell", *shell, "the shell")->required()->check(CLI::IsMember({"bash", "zsh"}));
  cmd->callback([cmd, shell] { std::cout << script(*cmd->get_parent(), *shell); });
}

}  // namespace qkv::cli
