// Internal: where a loader puts the f32 weights it finds stored as f32 in a file. One rule for
// every loader (load_llama2c, load_safetensors):
//
//   copied    read (MappedFile::read: pread) into an anonymous, 2 MiB-aligned arena asked for
//             transparent huge pages; the file is not kept mapped, so after loading the weights
//             are resident once (the page cache may still hold the file: reclaimable, not ours).
//   in_place  used where they lie in the file's private (copy-on-write) mapping, on 4 KiB pages.
//
// Copied is the default when the kernel gives huge pages to a region that asks for them
// (/sys/kernel/mm/transparent_hugepage/enabled reads [always] or [madvise]); otherwise in place.
// Copied floats keep the offset within a 64-byte line they have in the file (a llama2.c
// checkpoint's rows start at byte 28): only the page size changes.
// Why, measured (bench/results/decode_h7_2026-11-26.md, random stories110M-shaped model, 438 MB,
// 1 thread, interleaved): decode 62–64 tok/s copied onto huge pages vs 54–56 in place on the
// file's 4 KiB pages; the copy by pread costs ≈ 0.07 CPU s for the 438 MB (into 4 KiB pages
// 0.2–0.6 s; as a memcpy from the mapping, which faults the file in first, 0.07–0.6 s). On huge
// pages with every row starting on a 64-byte line the same decode ran at 50–55 tok/s (the GEMV
// is slower on line-aligned rows here), hence the kept offset.
//
// QKV_WEIGHT_PLACEMENT=copied|in_place overrides the rule (tests, A/B measurements).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace qkv::detail {

enum class Placement { in_place, copied };

// The placement for this load: QKV_WEIGHT_PLACEMENT when set and not empty (any other value
// throws std::invalid_argument naming `fn` and the value), else the rule above.
Placement weight_placement(const char* fn);

// At least `bytes` of writable memory (zero-filled by the kernel, untouched), 2 MiB-aligned, asked
// for transparent huge pages; `owner` unmaps it. check_memory() first; qkv::OutOfMemory naming
// `fn` and `what` if the mapping fails.
struct WeightArena {
  std::shared_ptr<void> owner;
  float* data = nullptr;
};
WeightArena weight_arena(std::uint64_t bytes, const char* fn, const std::string& what);

}  // namespace qkv::detail
