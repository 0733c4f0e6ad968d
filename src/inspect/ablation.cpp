// Head ablation for the inspect report (see report.hpp): what knocking one head out does to the
// prediction at the last position and to the prompt's loss.
//
// Dimension letters: S tokens, V vocabulary, L layers, H heads. Softmaxes are computed in f64 with
// the row's max subtracted.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "inspect/report.hpp"

namespace qkv::inspect {
namespace {

constexpr const char* kFn = "qkv::inspect::add_ablation_table";

// ln Σ_v exp(z_v) of one row z [V].
double log_sum_exp(const float* z, std::int64_t V) {
  const double zmax = *std::max_element(z, z + V);
  double sum = 0;
  for (std::int64_t v = 0; v < V; ++v) sum += std::exp(double{z[v]} - zmax);
  return zmax + std::log(sum);
}

}  // namespace

AblationEffect ablation_effect(const Report& r, const float* logits,
                               const std::function<std::string(std::int32_t)>& token_text) {
  const std::int64_t S = r.S, V = r.model.config.vocab_size;
  AblationEffect e;
  double loss = 0;
  for (std::int64_t s = 0; s + 1 < S; ++s) {
    const float* z = logits + s * V;
    loss += log_sum_exp(z, V) - z[r.tokens[static_cast<std::size_t>(s + 1)].id];
  }
  e.loss = S > 1 ? loss / static_cast<double>(S - 1) : std::numeric_limits<double>::quiet_NaN();
  const float* z = logits + (S - 1) * V;
  const double lse = log_sum_exp(z, V);
  e.p_predicted = std::exp(double{z[r.next_tokens.front().id]} - lse);
  const auto top = static_cast<std::int32_t>(std::max_element(z, z + V) - z);
  e.top = {top, token_text(top), std::exp(double{z[top]} - lse), z[top]};
  return e;
}

void add_ablation_table(Report& r, const float* logits, const AblatedForward& forward,
                        const std::function<std::string(std::int32_t)>& token_text) {
  if (!logits || !forward || r.next_tokens.empty() || r.model.config.vocab_size < 1) {
    fail(kFn, "logits, forward: need the unablated logits, a forward function and a report with next tokens");
  }
  const AblationEffect base = ablation_effect(r, logits, token_text);
  AblationTable t;
  t.p_predicted = base.p_predicted;
  t.loss = base.loss;
  std::vector<float> z(static_cast<std::size_t>(r.S * r.model.config.vocab_size));
  for (const auto kind : {HeadAblation::Kind::zero, HeadAblation::Kind::mean}) {
    for (std::int64_t l = 0; l < r.L; ++l) {
      for (std::int64_t h = 0; h < r.H; ++h) {
        forward(HeadAblation{static_cast<int>(l), static_cast<int>(h), kind}, z.data());
        (kind == HeadAblation::Kind::zero ? t.zero : t.mean).push_back(ablation_effect(r, z.data(), token_text));
      }
    }
  }
  r.ablation = std::move(t);
}

}  // namespace qkv::inspect
