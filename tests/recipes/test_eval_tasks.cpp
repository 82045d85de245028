// eval.task multiple_choice and exact_match (recipes/eval_tasks.h) on the tiny Llama fixture: log-likelihoods
// against a log-softmax of the model's own logits, accuracies against answers chosen to be half right.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "models/generate.h"
#include "models/hf_checkpoint.h"
#include "recipes/eval.h"
#include "recipes/eval_tasks.h"
#include "runtime/file_util.h"

namespace ingot::recipes {
namespace {

constexpr const char* kModel = "tests/fixtures/hf/llama_tiny";

Config task_config(const std::string& task, const std::string& data) {
  Config c = Config::parse("recipe: eval\ndevice: cpu\nmodel: {path: " + std::string(kModel) +
                               "}\ntokenizer: {path: tests/fixtures/data/tokenizer}\n"
                               "data: {path: " +
                               data + "}\neval: {task: " + task + ", max_new_tokens: 6}\n",
                           "eval.yaml");
  c.validate(eval_schema());
  return c;
}

// The summed log-probability of ids[start:] under the model, from a log-softmax of its logits on the host.
double reference_loglik(models::CausalLM& m, const std::vector<int32_t>& ids, size_t start) {
  NoGradGuard no_grad;
  const int64_t T = static_cast<int64_t>(ids.size());
  const Tensor logits = m.forward(from_vector_i64(std::vector<int64_t>(ids.begin(), ids.end()), {1, T}));
  const int64_t V = logits.size(2);
  const std::vector<double> l = logits.to_vector();
  double sum = 0;
  for (size_t t = start; t < ids.size(); ++t) {
    const double* row = &l[(t - 1) * static_cast<size_t>(V)];
    double mx = row[0], z = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, row[v]);
    for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - mx);
    sum += row[ids[t]] - mx - std::log(z);
  }
  return sum;
}

TEST(EvalTasks, MultipleChoiceScoresEachChoiceByItsLogLikelihoodAndCountsTheBest) {
  TempDir dir("ingot_eval_tasks");
  models::HFModel hf = models::load_hf_model(kModel);
  hf.model->eval();
  const Tokenizer tok = Tokenizer::from_dir("tests/fixtures/data/tokenizer");
  std::vector<ChoiceItem> items = {
      {"In the beginning God created", {"the heaven and the earth", "a fish", "light"}, 0},
      {"And God said, Let there be", {"light", "darkness upon the face", "waters"}, 0},
      {"And the evening and the morning were", {"the first day", "seven", "good"}, 0},
      {"And God called the light", {"Day", "Night", "Heaven and the earth"}, 0},
  };
  // The model's own best choice is the answer of the first two questions, another one of the last two.
  for (size_t q = 0; q < items.size(); ++q) {
    const std::vector<int32_t> ctx = tok.encode(items[q].question, {.add_special_tokens = true});
    std::vector<double> ll;
    for (const std::string& c : items[q].choices)
      ll.push_back(reference_loglik(*hf.model, tok.encode(items[q].question + " " + c, {.add_special_tokens = true}),
                                    ctx.size()));
    const int64_t best = std::max_element(ll.begin(), ll.end()) - ll.begin();
    items[q].answer = q < 2 ? best : (best + 1) % 3;
    std::string line =
        nlohmann::json{{"question", items[q].question}, {"choices", items[q].choices}, {"answer", items[q].answer}}
            .dump();
    std::ofstream(dir.file("mc.jsonl"), std::ios::app) << line << "\n";
    const ChoiceScore one = score_choices(*hf.model, tok, {items[q]}, Device::cpu());
    for (size_t c = 0; c < ll.size(); ++c)
      EXPECT_NEAR(one.loglik[0][c], ll[c], 1e-4 * std::abs(ll[c])) << q << " " << c;
  }
  std::ostringstream log;
  const EvalResult r = run_eval(resolve_eval(task_config("multiple_choice", dir.file("mc.jsonl"))), log);
  EXPECT_EQ(r.items, 4);
  EXPECT_DOUBLE_EQ(r.accuracy, 0.5);
  EXPECT_NE(log.str().find("eval | multiple_choice | accuracy 0.500 (acc_norm "), std::string::npos) << log.str();
  EXPECT_NE(eval_json(r).find("\"accuracy\": 0.5"), std::string::npos) << eval_json(r);
}

TEST(EvalTasks, ExactMatchComparesTheFirstLineOfAGreedyCompletion) {
  TempDir dir("ingot_eval_tasks");
  models::HFModel hf = models::load_hf_model(kModel);
  const Tokenizer tok = Tokenizer::from_dir("tests/fixtures/data/tokenizer");
  const std::string prompt = "In the beginning God created";
  const std::vector<int32_t> ids = tok.encode(prompt, {.add_special_tokens = true});
  models::GenerateOptions opts;
  opts.max_new_tokens = 6;
  if (tok.eos_id()) opts.eos_token_ids.push_back(*tok.eos_id());
  for (int64_t e : hf.config.eos_token_ids) opts.eos_token_ids.push_back(e);
  const std::vector<double> out =
      models::generate(
          *hf.model,
          from_vector_i64(std::vector<int64_t>(ids.begin(), ids.end()), {1, static_cast<int64_t>(ids.size())}), opts)
          .to_vector();
  std::vector<int32_t> fresh;
  for (size_t i = ids.size(); i < out.size(); ++i) fresh.push_back(static_cast<int32_t>(out[i]));
  DecodeOptions d;
  d.skip_special_tokens = true;
  std::string text = tok.decode(fresh, d);
  text = text.substr(0, text.find('\n'));
  std::ofstream(dir.file("em.jsonl")) << nlohmann::json{{"prompt", prompt}, {"answer", "  " + text + " "}}.dump()
                                      << "\n"
                                      << nlohmann::json{{"prompt", prompt}, {"answer", "not this"}}.dump() << "\n";
  std::ostringstream log;
  const EvalResult r = run_eval(resolve_eval(task_config("exact_match", dir.file("em.jsonl"))), log);
  EXPECT_EQ(r.items, 2);
  EXPECT_DOUBLE_EQ(r.exact_match, 0.5) << "completion: '" << text << "'";
  EXPECT_NE(log.str().find("eval | exact_match | 0.500 | 2 prompts"), std::string::npos) << log.str();
}

TEST(EvalTasks, AMalformedLineIsAConfigErrorNamingTheFileAndLine) {
  TempDir dir("ingot_eval_tasks");
  std::ofstream(dir.file("mc.jsonl")) << R"({"question": "q", "choices": ["a", "b"], "answer": 1})"
                                      << "\n\n"
                                      << R"({"question": "q", "choices": ["a", "b"], "answer": 2})"
                                      << "\n";
  try {
    resolve_eval(task_config("multiple_choice", dir.file("mc.jsonl")));
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("data.path: " + dir.file("mc.jsonl") +
                                         ":3: expected \"answer\", the 0-based index of the right choice (0 to 1) "
                                         "(eval.task: multiple_choice)"),
              std::string::npos)
        << e.what();
  }
  std::ofstream(dir.file("em.jsonl")) << R"({"prompt": "p"})"
                                      << "\n";
  try {
    resolve_eval(task_config("exact_match", dir.file("em.jsonl")));
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(":1: expected a string \"answer\""), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ingot::recipes
