// The qkv application as CLI11 sees it: the top-level options and every subcommand with its
// options, validators and action. main.cpp parses the real command line with it; the fuzzer
// fuzz/fuzz_cli.cpp builds the same app and parses its inputs with the actions switched off.
#include "cli/commands.hpp"
#include "qkv/attention.hpp"
#include "qkv/version.hpp"

namespace qkv::cli {

void build_app(CLI::App& app) {
  app.description("qkv: attention computed exactly and fast on the CPU; transformers run, trained and inspected");
  app.name("qkv");
  app.require_subcommand(1);
  app.fallthrough();
  // Option callbacks run while parsing, before any subcommand's callback does its work.
  app.add_option_function<int>(
         "--threads", [](int n) { qkv::set_num_threads(n); },
         "worker threads for the kernels (default: QKV_NUM_THREADS or all cores)")
      ->check(qkv::cli::at_least(1));
  app.set_version_flag("--version", "qkv " QKV_VERSION);

#define QKV_CLI_ADD(name) add_##name(app);
  QKV_CLI_COMMANDS(QKV_CLI_ADD)
#undef QKV_CLI_ADD
  // After the commands: a subcommand copies its parent's footer when it is created.
  app.footer(
      "Exit codes: 0 success; 1 error (a bad argument, such as a missing file); 2 usage error (unknown command or "
      "option, bad value); 3 I/O error (a read or write the system refused: disk full, no permission); 4 file "
      "format error (a truncated or corrupt model, tokenizer, config or checkpoint); 5 non-finite numbers (training "
      "diverged, a model's logits overflowed); 129, 130, 143: qkv train stopped by SIGHUP, SIGINT, SIGTERM (128 + "
      "the signal) after saving its checkpoint.\n"
      "Scripts: --prompt - reads the text from stdin; --json (params, attend, generate) prints one JSON "
      "document; source <(qkv completion bash) completes commands and options.");
}

}  // namespace qkv::cli
