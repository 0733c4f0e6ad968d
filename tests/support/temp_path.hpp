// temp_path(name): a path for a test's scratch file, in a folder of this test process's own
// (TempDir()/qkv_test_<pid>/), which is removed with everything in it when the process exits
// normally. ctest runs every test in its own process, so no run leaves files behind, and a
// crashed test's files stay for a look.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

#include <gtest/gtest.h>

namespace qkv::testing {

inline const std::filesystem::path& temp_folder() {
  struct Folder {
    std::filesystem::path path;
    Folder() : path(std::filesystem::path(::testing::TempDir()) / ("qkv_test_" + std::to_string(::getpid()))) {
      std::filesystem::create_directories(path);
    }
    ~Folder() {
      std::error_code ec;  // best effort: a file still open elsewhere must not abort the exit
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Folder folder;
  return folder.path;
}

inline std::string temp_path(const std::string& name) { return (temp_folder() / name).string(); }

}  // namespace qkv::testing
