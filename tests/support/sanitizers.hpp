// Loop counts of the threading tests under ThreadSanitizer (scripts/tsan.sh, which CI runs).
// TSan runs every memory access through its runtime (5–15× slower, much more for the byte loops
// and yields of the stress tests), so the tests that repeat a concurrent pattern many times run
// it kTsanDivisor times fewer rounds there: every kind of interleaving the test sets up still
// happens, by all of its threads, in each round; the full counts run in the ordinary and ASan
// builds. The tests themselves are never skipped.
#pragma once

#include <algorithm>

namespace qkv::testing {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

inline constexpr int kTsanDivisor = 10;

// `rounds` in an ordinary build; under TSan rounds / kTsanDivisor, at least 2.
constexpr int tsan_rounds(int rounds) { return kThreadSanitizer ? std::max(2, rounds / kTsanDivisor) : rounds; }

}  // namespace qkv::testing
