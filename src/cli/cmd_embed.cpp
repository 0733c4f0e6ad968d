// qkv embed — sentence embeddings of a text file, one per line, with a sentence-transformers model.
//
//   qkv embed --model DIR --input lines.txt --out e.npy       (float32 [N, dim], row i = line i)
//   qkv embed --model DIR --input - --out e.jsonl < lines.txt  (one JSON array per line)
//   qkv embed ... --batch 32 --threads 2 --dtype bf16
//
// An empty line is embedded as the empty text (as sentence-transformers does); a line that is not
// valid UTF-8 is an error naming its number. On a terminal a progress bar (texts done, sentences/s,
// time left) is redrawn on stderr after each batch; the closing summary line is always printed.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "cli/io.hpp"
#include "core/output_file.hpp"
#include "qkv/encoder.hpp"

namespace qkv::cli {
namespace {

constexpr const char* kFn = "qkv embed";

struct EmbedArgs {
  std::string model, input, out;
  std::int64_t batch = 32;
  std::string dtype = "f32";
};

// --out is checked before the model loads: its suffix, and that a file can be created beside it
// (the temporary name write_embeddings writes first), so a bad path costs no embedding time.
void check_out(const std::string& path) {
  if (!path.ends_with(".npy") && !path.ends_with(".jsonl")) fail(kFn, "--out '" + path + "': must end in .npy or .jsonl");
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail_io(kFn, "--out '" + path + "': cannot create a file there: " + std::strerror(errno));
  }
  std::remove(tmp.c_str());
}

// The progress line on a terminal: "[#########...............] 640/2000 texts, 21.3 sentences/s, 1:04 left".
void print_progress(std::int64_t done, std::int64_t total, double seconds) {
  constexpr int kWidth = 24;
  const int full = total > 0 ? static_cast<int>((kWidth * done + total / 2) / total) : kWidth;
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0.0;
  const long left = rate > 0 ? std::lround(static_cast<double>(total - done) / rate) : 0;
  std::fprintf(stderr, "\r[%s%s] %lld/%lld texts, %.1f sentences/s, %ld:%02ld left ", std::string(full, '#').c_str(),
               std::string(kWidth - full, '.').c_str(), static_cast<long long>(done), static_cast<long long>(total),
               rate, left / 60, left % 60);
}

// e [N, C] to `path` (.npy: NumPy format 1.0, little-endian float32, C order; .jsonl: one array per
// line, each value with 9 significant digits, which round-trips a float32), written to a
// temporary name and renamed.
void write_embeddings(const std::string& path, const float* e, std::int64_t N, std::int64_t C) {
  const bool npy = path.ends_with(".npy");  // else .jsonl (check_out)
  std::string bytes;
  if (npy) {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(N) + ", " +
                         std::to_string(C) + "), }";
    header.append(64 - (10 + header.size() + 1) % 64, ' ');  // magic + len + header + '\n' to a multiple of 64
    header += '\n';
    const auto len = static_cast<std::uint16_t>(header.size());
    bytes.append("\x93NUMPY\x01\x00", 8);
    bytes += static_cast<char>(len & 0xFF);
    bytes += static_cast<char>(len >> 8);
    bytes += header;
    bytes.append(reinterpret_cast<const char*>(e), static_cast<std::size_t>(N * C * 4));
  } else {
    char num[32];
    for (std::int64_t i = 0; i < N; ++i) {
      bytes += '[';
      for (std::int64_t k = 0; k < C; ++k) {
        std::snprintf(num, sizeof num, "%.9g", static_cast<double>(e[i * C + k]));
        if (k) bytes += ',';
        bytes += num;
      }
      bytes += "]\n";
    }
  }
  detail::write_file_atomic(path, bytes, kFn, "--out");
}

void run(const EmbedArgs& a) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  check_input(kFn, "--model", a.model, /*allow_folder=*/true);
  if (a.input != "-") check_input(kFn, "--input", a.input);
  check_out(a.out);
  EncoderOptions o;
  o.dtype = a.dtype == "bf16" ? DType::bf16 : DType::f32;
  Encoder enc = Encoder::load(a.model, o);
  const std::vector<std::string> lines = read_lines(kFn, "--input", a.input);
  // Each line is tokenized once here to name a bad line by its number (embed tokenizes again: a
  // few milliseconds for thousands of lines).
  for (std::size_t i = 0; i < lines.size(); ++i) {
    try {
      (void)enc.tokenize(lines[i]);
    } catch (const std::invalid_argument& e) {
      fail(kFn, "--input '" + a.input + "' line " + std::to_string(i + 1) + ": " + e.what());
    }
  }
  const auto N = static_cast<std::int64_t>(lines.size());
  std::vector<float> e(static_cast<std::size_t>(N * enc.dim()));
  const bool tty = ::isatty(2) != 0;
  const auto t1 = clock::now();
  enc.embed(lines, e.data(), a.batch, [&](std::int64_t done, std::int64_t total) {
    if (tty) print_progress(done, total, std::chrono::duration<double>(clock::now() - t1).count());
  });
  if (tty && N > 0) std::fputc('\n', stderr);
  const double embed_s = std::chrono::duration<double>(clock::now() - t1).count();
  write_embeddings(a.out, e.data(), N, enc.dim());
  const double all_s = std::chrono::duration<double>(clock::now() - t0).count();
  std::fprintf(stderr, "embedded %lld texts (dim %lld, %s) in %.2f s: %.1f sentences/s; %.1f sentences/s with load and I/O\n",
               static_cast<long long>(N), static_cast<long long>(enc.dim()), a.dtype.c_str(), embed_s,
               embed_s > 0 ? static_cast<double>(N) / embed_s : 0.0, all_s > 0 ? static_cast<double>(N) / all_s : 0.0);
}

}  // namespace

void add_embed(CLI::App& app) {
  auto a = std::make_shared<EmbedArgs>();
  CLI::App* sub = app.add_subcommand("embed", "sentence embeddings of each line of a file (a BERT-family encoder)");
  sub->add_option("--model", a->model, "a sentence-transformers folder (modules.json, config.json, model.safetensors, ...)")
      ->required();
  sub->add_option("--input", a->input, "text file, one text per line ('-': stdin)")->required();
  sub->add_option("--out", a->out, "output: .npy (float32 [N, dim], row i = line i) or .jsonl")->required();
  sub->add_option("--batch", a->batch, "texts per packed batch (sorted by length)")->capture_default_str()->check(at_least(1));
  sub->add_option("--dtype", a->dtype, "f32 (exact) or bf16 (projections on bf16 inputs and weights, f32 sums)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  sub->callback([a] { run(*a); });
}

}  // namespace qkv::cli
