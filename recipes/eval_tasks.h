// Evaluations beyond perplexity, chosen by the eval recipe's eval.task (recipes/eval.h):
//
//   multiple_choice  JSONL lines {"question": "...", "choices": ["...", ...], "answer": i}. Each choice is scored
//                    by the log-likelihood of its tokens after the question and one space (lm-evaluation-harness's
//                    `acc`; `acc_norm` divides it by the choice's length in bytes); a question counts as right
//                    when its best choice is `answer` (0-based).
//   exact_match      JSONL lines {"prompt": "...", "answer": "..."}. Greedy generation of up to
//                    eval.max_new_tokens; a match when the completion's first line, trimmed, equals the trimmed
//                    answer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/causal_lm.h"
#include "recipes/tokenizer/tokenizer.h"
#include "runtime/device.h"

namespace ingot::recipes {

struct ChoiceItem {
  std::string question;
  std::vector<std::string> choices;
  int64_t answer = 0;
};
struct MatchItem {
  std::string prompt, answer;
};

// Read a task's JSONL file; a malformed line throws ConfigError naming path:line and what is wrong, so
// `ingot validate` finds it. An empty file is an error too.
std::vector<ChoiceItem> read_choice_items(const std::string& path);
std::vector<MatchItem> read_match_items(const std::string& path);

struct ChoiceScore {
  double accuracy = 0, accuracy_norm = 0;
  int64_t questions = 0;
  std::vector<int64_t> predicted;           // the best choice of each question (acc)
  std::vector<std::vector<double>> loglik;  // per question, per choice: summed log-probability of its tokens
};
ChoiceScore score_choices(models::CausalLM& model, const Tokenizer& tok, const std::vector<ChoiceItem>& items,
                          Device device);

struct MatchScore {
  double exact_match = 0;
  int64_t prompts = 0;
  std::vector<std::string> completions;  // each prompt's first completion line, trimmed
};
MatchScore score_exact_match(models::CausalLM& model, const Tokenizer& tok, const std::vector<MatchItem>& items,
                             Device device, int64_t max_new_tokens, const std::vector<int64_t>& eos_token_ids);

}  // namespace ingot::recipes
