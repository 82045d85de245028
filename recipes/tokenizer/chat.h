// Chat templates for instruction data, rendered natively (no Jinja engine): the text equals what
// transformers' apply_chat_template produces with the model's own template, and each piece of it is marked
// as prompt (excluded from the loss) or response (trained on).
//
// Formats:
//   llama3  <|begin_of_text|><|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>...  (content trimmed)
//   chatml  <|im_start|>ROLE\nCONTENT<|im_end|>\n...                                  (Qwen2/2.5, many others)
//   qwen3   chatml, plus Qwen3's <think> handling: the assistant turns after the last user message carry a
//           <think>...</think> block (empty when the message has no reasoning)
//   alpaca  "<preamble>\n\n### Instruction:\n...\n\n### Response:\n" + response + EOS, for base models
// Trained on: every assistant message's content and its end-of-turn token (<|eot_id|> / <|im_end|> / EOS);
// everything else (system, user, headers, the newline after <|im_end|>) is prompt.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "recipes/tokenizer/tokenizer.h"

namespace ingot::recipes {

// The label that cross_entropy ignores (ignore_index); prompt tokens get it.
inline constexpr int32_t kIgnoreIndex = -100;

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

enum class ChatFormat { Llama3, ChatML, Qwen3, Alpaca };

struct ChatTemplate {
  ChatFormat format = ChatFormat::ChatML;
  // Llama 3's original template appends the assistant header even without add_generation_prompt.
  bool always_generation_prompt = false;
  std::string bos;  // llama3: the BOS text the template starts with
  std::string eos;  // alpaca: appended to the response

  // "llama3", "chatml", "qwen3" or "alpaca"; BOS/EOS text from the tokenizer. Throws listing the names.
  static ChatTemplate from_name(const std::string& name, const Tokenizer& tok);
  // Recognizes the tokenizer_config.json chat template of the supported families (by their marker tokens
  // and structure). Throws when the tokenizer has no template or an unrecognized one, suggesting from_name.
  static ChatTemplate detect(const Tokenizer& tok);
};

// The Jinja chat template (tokenizer_config.json's "chat_template") that renders as render_chat does and
// that ChatTemplate::detect recognizes, for exports; "" for Qwen3, whose template (reasoning blocks, tools)
// an export keeps from its source tokenizer.
std::string chat_template_jinja(ChatFormat format);

struct ChatSegment {
  std::string text;
  bool train = false;  // part of an assistant response
};

struct ChatOptions {
  bool add_generation_prompt = false;  // end with the assistant header (for generation)
};

// The rendered conversation as consecutive segments; concatenated they are the template's text. Throws on
// an unknown role or an empty conversation.
std::vector<ChatSegment> render_chat(const ChatTemplate& tmpl, std::span<const ChatMessage> messages,
                                     const ChatOptions& opts = {});
std::string render_chat_text(const ChatTemplate& tmpl, std::span<const ChatMessage> messages,
                             const ChatOptions& opts = {});

struct TokenizedChat {
  std::vector<int32_t> ids;
  std::vector<int32_t> labels;  // ids where trained on, kIgnoreIndex for prompt tokens (same length as ids)
};

// Tokenizes each segment (special tokens in the text are parsed, as transformers does) and builds the labels.
// Segment boundaries lie at special tokens or right after a header's newline, where the supported
// pre-tokenizers split anyway, so ids equal encode(render_chat_text(...)) (checked against transformers in
// tests/recipes/test_chat.cpp); a response that starts with whitespace right after a header newline is the
// one case where a single-pass encode could merge differently.
TokenizedChat tokenize_chat(const Tokenizer& tok, const ChatTemplate& tmpl, std::span<const ChatMessage> messages,
                            const ChatOptions& opts = {});

}  // namespace ingot::recipes
