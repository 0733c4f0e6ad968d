// expect_rejects(f, {pieces…}): f() must throw std::invalid_argument whose message contains every
// piece (the function name, the argument, the shapes …). Prints the message so logs show it.
#pragma once

#include <cstdio>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

namespace qkv::testing {

template <class F>
void expect_rejects(F&& f, std::initializer_list<const char*> pieces) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning '" << *pieces.begin() << "'";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    std::printf("rejected: %s\n", msg.c_str());
    for (const char* p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  }
}

}  // namespace qkv::testing
