#include "recipes/eval_tasks.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>

#include "models/generate.h"
#include "recipes/config.h"
#include "runtime/file_util.h"

namespace ingot::recipes {

namespace {

constexpr int64_t kIgnore = -100;

// Each non-empty line of `path` as a JSON object, with its line number.
std::vector<std::pair<int64_t, nlohmann::json>> json_lines(const std::string& path) {
  std::istringstream in(read_file(path));
  std::vector<std::pair<int64_t, nlohmann::json>> out;
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) throw ConfigError(path + ":" + std::to_string(n) + ": not a JSON object");
    out.emplace_back(n, std::move(j));
  }
  if (out.empty()) throw ConfigError(path + ": holds no JSON line to evaluate");
  return out;
}

std::string field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_string()) throw ConfigError(where + ": expected a string \"" + key + "\"");
  return j[key].get<std::string>();
}

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

}  // namespace

std::vector<ChoiceItem> read_choice_items(const std::string& path) {
  std::vector<ChoiceItem> items;
  for (const auto& [n, j] : json_lines(path)) {
    const std::string where = path + ":" + std::to_string(n);
    ChoiceItem it;
    it.question = field(j, "question", where);
    if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].size() < 2)
      throw ConfigError(where + ": expected \"choices\", a list of two strings or more");
    for (const auto& c : j["choices"]) {
      if (!c.is_string()) throw ConfigError(where + ": every choice must be a string");
      it.choices.push_back(c.get<std::string>());
    }
    if (!j.contains("answer") || !j["answer"].is_number_integer() || j["answer"].get<int64_t>() < 0 ||
        j["answer"].get<int64_t>() >= static_cast<int64_t>(it.choices.size()))
      throw ConfigError(where + ": expected \"answer\", the 0-based index of the right choice (0 to " +
                        std::to_string(it.choices.size() - 1) + ")");
    it.answer = j["answer"].get<int64_t>();
    items.push_back(std::move(it));
  }
  return items;
}

std::vector<MatchItem> read_match_items(const std::string& path) {
  std::vector<MatchItem> items;
  for (const auto& [n, j] : json_lines(path)) {
    const std::string where = path + ":" + std::to_string(n);
    items.push_back({field(j, "prompt", where), field(j, "answer", where)});
  }
  return items;
}

ChoiceScore score_choices(models::CausalLM& model, const Tokenizer& tok, const std::vector<ChoiceItem>& items,
                          Device device) {
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  ChoiceScore s;
  int64_t right = 0, right_norm = 0;
  for (const ChoiceItem& it : items) {
    const std::vector<int32_t> context = tok.encode(it.question, {.add_special_tokens = true});
    std::vector<double> ll, ll_norm;
    for (const std::string& choice : it.choices) {
      // The whole text is encoded at once (a choice may merge with the space before it); the choice's tokens are
      // those after the question's, as lm-evaluation-harness splits them.
      std::vector<int32_t> ids = tok.encode(it.question + " " + choice, {.add_special_tokens = true});
      size_t start = context.size();
      if (ids.size() <= start || !std::equal(context.begin(), context.end(), ids.begin())) {
        ids = context;
        const std::vector<int32_t> cont = tok.encode(" " + choice, {.add_special_tokens = false});
        ids.insert(ids.end(), cont.begin(), cont.end());
      }
      INGOT_CHECK(ids.size() > start && start > 0, "multiple_choice: the choice '", choice, "' of '", it.question,
                  "' encodes to no token after the question");
      const int64_t T = static_cast<int64_t>(ids.size());
      std::vector<int64_t> in(ids.begin(), ids.end()), targets(ids.size(), kIgnore);
      for (size_t t = start; t < ids.size(); ++t) targets[t - 1] = ids[t];
      const double n = static_cast<double>(ids.size() - start);
      const double loss =
          model.loss(from_vector_i64(in, {1, T}, device), from_vector_i64(targets, {1, T}, device)).item();
      ll.push_back(-loss * n);
      ll_norm.push_back(-loss * n / static_cast<double>(std::max<size_t>(1, choice.size())));
    }
    const int64_t best = std::max_element(ll.begin(), ll.end()) - ll.begin();
    const int64_t best_norm = std::max_element(ll_norm.begin(), ll_norm.end()) - ll_norm.begin();
    right += best == it.answer;
    right_norm += best_norm == it.answer;
    s.predicted.push_back(best);
    s.loglik.push_back(std::move(ll));
  }
  model.train(was_training);
  s.questions = static_cast<int64_t>(items.size());
  s.accuracy = static_cast<double>(right) / static_cast<double>(std::max<int64_t>(1, s.questions));
  s.accuracy_norm = static_cast<double>(right_norm) / static_cast<double>(std::max<int64_t>(1, s.questions));
  return s;
}

MatchScore score_exact_match(models::CausalLM& model, const Tokenizer& tok, const std::vector<MatchItem>& items,
                             Device device, int64_t max_new_tokens, const std::vector<int64_t>& eos_token_ids) {
  models::GenerateOptions opts;
  opts.max_new_tokens = max_new_tokens;
  opts.eos_token_ids = eos_token_ids;
  MatchScore s;
  int64_t matches = 0;
  for (const MatchItem& it : items) {
    const std::vector<int32_t> ids = tok.encode(it.prompt, {.add_special_tokens = true});
    INGOT_CHECK(!ids.empty(), "exact_match: the prompt '", it.prompt, "' encodes to no token");
    const int64_t T = static_cast<int64_t>(ids.size());
    const int64_t positions = model.max_positions();
    INGOT_CHECK(positions == 0 || T + max_new_tokens <= positions, "eval.max_new_tokens: the prompt '", it.prompt,
                "' (", T, " tokens) + ", max_new_tokens, " new ones exceed the model's ", positions, " positions");
    std::vector<int64_t> in(ids.begin(), ids.end());
    const std::vector<double> out = models::generate(model, from_vector_i64(in, {1, T}, device), opts).to_vector();
    std::vector<int32_t> fresh;
    for (size_t i = static_cast<size_t>(T); i < out.size(); ++i) fresh.push_back(static_cast<int32_t>(out[i]));
    DecodeOptions decode;
    decode.skip_special_tokens = true;
    const std::string text = trimmed(tok.decode(fresh, decode));
    const std::string first_line = trimmed(text.substr(0, text.find('\n')));
    matches += first_line == trimmed(it.answer);
    s.completions.push_back(first_line);
  }
  s.prompts = static_cast<int64_t>(items.size());
  s.exact_match = static_cast<double>(matches) / static_cast<double>(std::max<int64_t>(1, s.prompts));
  return s;
}

}  // namespace ingot::recipes
