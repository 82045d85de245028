#include <filesystem>

#include "autograd/nn/layers.h"
#include "runtime/safetensors.h"
#include "testing.h"

namespace ingot {
namespace {

// A two-level tree: block.fc (Linear with bias), block.norm (LayerNorm), a buffer and a dropout.
class Block : public nn::Module {
 public:
  Block() {
    fc = register_module("fc", std::make_shared<nn::Linear>(4, 3));
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(3));
    drop = register_module("drop", std::make_shared<nn::Dropout>(0.5));
  }
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Dropout> drop;
};

class Net : public nn::Module {
 public:
  Net() {
    scale = register_parameter("scale", ones({3}));
    block = register_module("block", std::make_shared<Block>());
    steps = register_buffer("steps", from_vector_i64({7}, {1}));
  }
  Tensor forward(const Tensor& x) { return mul(block->drop->forward(block->norm->forward(block->fc->forward(x))), scale); }
  Tensor scale, steps;
  std::shared_ptr<Block> block;
};

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& v) {
  std::vector<std::string> n;
  for (auto& [k, _] : v) n.push_back(k);
  return n;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("ingot_test_module_" + name + ".safetensors")).string();
}

std::string load_error(Net& net, const std::map<std::string, Tensor>& sd, bool strict = true) {
  try {
    net.load_state_dict(sd, strict);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Module, NamedParametersAreDottedAndInRegistrationOrder) {
  Net net;
  EXPECT_EQ(names_of(net.named_parameters()),
            (std::vector<std::string>{"scale", "block.fc.weight", "block.fc.bias", "block.norm.weight",
                                      "block.norm.bias"}));
  EXPECT_EQ(names_of(net.named_buffers()), std::vector<std::string>{"steps"});
  EXPECT_EQ(net.num_parameters(), 3 + 12 + 3 + 3 + 3);
  EXPECT_EQ(net.state_dict().size(), 6u);
  for (const Tensor& p : net.parameters()) EXPECT_TRUE(p.requires_grad());
  std::vector<std::string> mods;
  for (auto& [n, _] : net.named_modules()) mods.push_back(n);
  EXPECT_EQ(mods, (std::vector<std::string>{"block", "block.fc", "block.norm", "block.drop"}));
}

TEST(Module, RegisteringADuplicateOrDottedNameFails) {
  struct Bad : nn::Module {
    void twice() {
      register_parameter("w", ones({1}));
      register_parameter("w", ones({1}));
    }
    void dotted() { register_parameter("a.b", ones({1})); }
  };
  EXPECT_THROW(Bad().twice(), Error);
  EXPECT_THROW(Bad().dotted(), Error);
}

TEST(Module, EvalModeTurnsDropoutOffRecursively) {
  manual_seed(5);
  Net net;
  Tensor x = randn({64, 4});
  net.eval();
  EXPECT_FALSE(net.block->drop->is_training());
  Tensor a = net.forward(x), b = net.forward(x);
  EXPECT_TRUE(allclose(a, b));
  net.train();
  EXPECT_TRUE(net.block->drop->is_training());
  Tensor c = net.forward(x);
  int zeros_seen = 0;
  for (double v : c.to_vector()) zeros_seen += v == 0.0;
  EXPECT_GT(zeros_seen, 40);  // about half of 192
}

TEST(Module, ToDTypeCastsInPlaceKeepingHandlesAndLeaves) {
  manual_seed(6);
  Net net;
  Tensor w = net.block->fc->weight();
  std::vector<double> before = w.to_vector();
  net.to(DType::f64);
  EXPECT_EQ(w.dtype(), DType::f64);  // the handle held by the layer sees the cast
  EXPECT_TRUE(w.requires_grad() && w.is_leaf());
  EXPECT_EQ(net.steps.dtype(), DType::i64);  // integer buffers are not cast
  std::vector<double> after = w.to_vector();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i], after[i]);
  Tensor y = net.forward(randn({2, 4}, DType::f64));
  EXPECT_EQ(y.dtype(), DType::f64);
  sum(y).backward();
  EXPECT_TRUE(w.grad().defined());
  net.zero_grad();
  EXPECT_FALSE(w.grad().defined());
}

TEST(Module, SaveAndLoadRoundTripThroughSafetensors) {
  manual_seed(7);
  Net a, b;
  const std::string path = temp_path("roundtrip");
  a.save(path);
  EXPECT_FALSE(allclose(a.block->fc->weight(), b.block->fc->weight()));
  b.load(path);
  for (auto& [name, t] : a.state_dict()) EXPECT_TRUE(allclose(t, b.state_dict().at(name))) << name;
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.names().size(), 6u);
  std::filesystem::remove(path);
}

TEST(Module, LoadErrorNamesTheMissingTensor) {
  Net net;
  auto sd = net.state_dict();
  sd.erase("block.norm.bias");
  std::string e = load_error(net, sd);
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
  EXPECT_NE(e.find("block.norm.bias"), std::string::npos) << e;
  EXPECT_EQ(load_error(net, sd, /*strict=*/false), "");
}

TEST(Module, LoadErrorNamesTheUnexpectedTensor) {
  Net net;
  auto sd = net.state_dict();
  sd["block.fc.extra"] = ones({2});
  std::string e = load_error(net, sd);
  EXPECT_NE(e.find("unexpected"), std::string::npos) << e;
  EXPECT_NE(e.find("block.fc.extra"), std::string::npos) << e;
  EXPECT_EQ(load_error(net, sd, /*strict=*/false), "");
}

TEST(Module, LoadErrorNamesTheWrongShapeAndDtypeEvenWhenNotStrict) {
  Net net;
  auto sd = net.state_dict();
  sd["block.fc.weight"] = ones({4, 3});
  sd["scale"] = ones({3}, DType::bf16);
  std::string e = load_error(net, sd, /*strict=*/false);
  EXPECT_NE(e.find("block.fc.weight (expected f32[3, 4], got f32[4, 3])"), std::string::npos) << e;
  EXPECT_NE(e.find("scale (expected f32[3], got bf16[3])"), std::string::npos) << e;
}

TEST(Module, LoadFromFileNamesTheFileAndTheTensor) {
  Net a;
  struct Small : nn::Module {
    Small() { register_parameter("scale", ones({3})); }
  } small;
  const std::string path = temp_path("partial");
  small.save(path);
  try {
    a.load(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("block.fc.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
  }
  std::filesystem::remove(path);
}

TEST(Module, ComputeDtypePropagatesAndCastsLinear) {
  manual_seed(8);
  nn::Linear fc(4, 3);
  Tensor x = randn({2, 4});
  fc.set_compute_dtype(DType::bf16);
  Tensor y = fc.forward(x);
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_EQ(fc.weight().dtype(), DType::f32);
  fc.set_compute_dtype(std::nullopt);
  EXPECT_LE(max_rel_error(y, fc.forward(x), 2e-2, 2e-2), 1.0);
  sum(cast(y, DType::f32)).backward();
  EXPECT_EQ(fc.weight().grad().dtype(), DType::f32);
}

}  // namespace
}  // namespace ingot
