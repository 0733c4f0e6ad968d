// The kinds of error (qkv/types.hpp): a bad argument is std::invalid_argument; an I/O failure, a
// corrupt file and a run whose numbers became non-finite each have their own type, all three a
// qkv::Error and none a std::invalid_argument. One real failure of each kind through the public
// API (the Python classes: python/tests/test_errors.py; the CLI's exit codes: tests/cli/exit_codes.sh).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <gtest/gtest.h>

#include "qkv/model.hpp"
#include "train/trainer.hpp"

namespace {

namespace fs = std::filesystem;

const std::string kModels = std::string(QKV_SOURCE_DIR) + "/data/models/stories260K/";

// The three kinds are qkv::Error, never std::invalid_argument: `catch (std::invalid_argument&)`
// keeps meaning "the caller passed something wrong".
static_assert(std::is_base_of_v<qkv::Error, qkv::IoError> && std::is_base_of_v<qkv::Error, qkv::FormatError> &&
              std::is_base_of_v<qkv::Error, qkv::NonFiniteError>);
static_assert(std::is_base_of_v<std::runtime_error, qkv::Error> && !std::is_base_of_v<std::invalid_argument, qkv::Error>);

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("qkv_error_kinds_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// The message of the E that f throws; fails the test (naming what came instead) for anything else.
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    std::printf("  %s\n", e.what());
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "another kind of error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no error";
  return "";
}

// A missing file is a bad argument (the caller named it), not an I/O failure.
TEST(ErrorKinds, AMissingFileIsABadArgument) {
  const std::string m = message_of<std::invalid_argument>([] { qkv::load_llama2c("/nonexistent/model.bin"); });
  EXPECT_NE(m.find("[qkv::load_llama2c] path '/nonexistent/model.bin': no such file"), std::string::npos) << m;
}

// A write the system refuses: the folder of the output does not exist, so open() fails (ENOENT).
TEST(ErrorKinds, AWriteTheSystemRefusesIsAnIoError) {
  const qkv::Weights w = qkv::Weights::random(qkv::load_llama2c(kModels + "stories260K.bin").config, 1);
  const std::string path = "/nonexistent-qkv-folder/model.safetensors";
  const std::string m = message_of<qkv::IoError>([&] { qkv::save_safetensors(w, path); });
  EXPECT_NE(m.find("'" + path + "': cannot open the temporary"), std::string::npos) << m;
  EXPECT_NE(m.find("No such file or directory"), std::string::npos) << m;
}

// A truncated llama2.c checkpoint (its header promises more floats than the file holds) and a
// config that is not JSON.
TEST(ErrorKinds, ACorruptFileIsAFormatError) {
  const std::string dir = temp_dir("format");
  std::ifstream in(kModels + "stories260K.bin", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 1000u);
  std::ofstream(dir + "/cut.bin", std::ios::binary) << bytes.substr(0, 1000);
  std::string m = message_of<qkv::FormatError>([&] { qkv::load_llama2c(dir + "/cut.bin"); });
  EXPECT_NE(m.find("cut.bin': is 1000 bytes but its header"), std::string::npos) << m;
  EXPECT_NE(m.find("(truncated)"), std::string::npos) << m;
  m = message_of<qkv::FormatError>([] { qkv::config_from_json("{\"dim\": 8", "model.json"); });
  EXPECT_NE(m.find("[qkv::config_from_json] model.json: not valid JSON"), std::string::npos) << m;
  fs::remove_all(dir);
}

// Training with a learning rate of 1e30: the first AdamW update moves every weight by ~1e30, the
// next forward overflows float and the loss is NaN or inf; the run stops naming the step.
TEST(ErrorKinds, TrainingThatDivergesIsANonFiniteError) {
  const std::string dir = temp_dir("diverge");
  qkv::train::TrainOptions o;
  o.data_path = std::string(QKV_SOURCE_DIR) + "/data/tinyshakespeare/input.txt";
  o.out_dir = dir + "/run";
  o.model.layers = 1, o.model.heads = 2, o.model.embd = 16, o.model.context = 16;
  o.batch = 2, o.steps = 20, o.eval_interval = 1000, o.eval_batches = 1, o.checkpoint_interval = 1000;
  o.opt.warmup = 0, o.opt.decay_steps = 20, o.opt.lr = 1e30;
  const std::string m = message_of<qkv::NonFiniteError>([&] { qkv::train::train(o); });
  EXPECT_NE(m.find("[qkv::train] training diverged: the loss is"), std::string::npos) << m;
  EXPECT_NE(m.find("(try a lower --lr)"), std::string::npos) << m;
  fs::remove_all(dir);
}

}  // namespace
