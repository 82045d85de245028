#include "recipes/tokenizer/chat.h"

#include "runtime/error.h"

namespace ingot::recipes {

namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Jinja's trim / Python's str.strip() for ASCII whitespace.
std::string trim(const std::string& s, bool left = true, bool right = true, bool newlines_only = false) {
  auto strip = [&](char c) { return newlines_only ? c == '\n' : is_ws(c); };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && strip(s[b])) ++b;
  if (right)
    while (e > b && strip(s[e - 1])) --e;
  return s.substr(b, e - b);
}

void check_role(const ChatMessage& m, size_t i) {
  INGOT_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant", "chat: message ", i, " has role \"",
              m.role, "\"; expected system, user or assistant");
}

std::string token_text(const Tokenizer& tok, std::optional<int32_t> id) { return id ? tok.id_to_token(*id) : ""; }

}  // namespace

ChatTemplate ChatTemplate::from_name(const std::string& name, const Tokenizer& tok) {
  ChatTemplate t;
  if (name == "llama3") t.format = ChatFormat::Llama3;
  else if (name == "chatml") t.format = ChatFormat::ChatML;
  else if (name == "qwen3") t.format = ChatFormat::Qwen3;
  else if (name == "alpaca") t.format = ChatFormat::Alpaca;
  else INGOT_FAIL("chat template \"", name, "\" is not known; expected one of llama3, chatml, qwen3, alpaca");
  t.bos = token_text(tok, tok.bos_id());
  t.eos = token_text(tok, tok.eos_id());
  if (t.format == ChatFormat::Llama3) {
    if (t.bos.empty()) t.bos = "<|begin_of_text|>";
    INGOT_CHECK(tok.token_to_id("<|start_header_id|>") && tok.token_to_id("<|eot_id|>"), "chat template llama3: ",
                tok.name(), " has no <|start_header_id|> / <|eot_id|> tokens");
  }
  if (t.format == ChatFormat::ChatML || t.format == ChatFormat::Qwen3)
    INGOT_CHECK(tok.token_to_id("<|im_start|>") && tok.token_to_id("<|im_end|>"), "chat template ", name, ": ",
                tok.name(), " has no <|im_start|> / <|im_end|> tokens");
  if (t.format == ChatFormat::Alpaca)
    INGOT_CHECK(!t.eos.empty(), "chat template alpaca: ", tok.name(), " has no eos_token to end responses with");
  return t;
}

ChatTemplate ChatTemplate::detect(const Tokenizer& tok) {
  const std::string& j = tok.chat_template();
  INGOT_CHECK(!j.empty(), "chat template: ", tok.name(),
              " has no chat_template in tokenizer_config.json; name one (llama3, chatml, qwen3, alpaca)");
  ChatTemplate t;
  if (j.find("<|start_header_id|>") != std::string::npos && j.find("<|eot_id|>") != std::string::npos) {
    // Llama 3.1+ templates add tool and date preambles this renderer does not reproduce.
    INGOT_CHECK(j.find("Cutting Knowledge Date") == std::string::npos, "chat template: ", tok.name(),
                ": the Llama 3.1+ template (date and tools preamble) is not rendered natively; use name llama3 to "
                "get the Llama 3 format");
    t = from_name("llama3", tok);
    t.always_generation_prompt = j.find("add_generation_prompt") == std::string::npos;
    return t;
  }
  if (j.find("<|im_start|>") != std::string::npos)
    return from_name(j.find("</think>") != std::string::npos ? "qwen3" : "chatml", tok);
  if (j.find("### Instruction:") != std::string::npos && j.find("### Response:") != std::string::npos)
    return from_name("alpaca", tok);
  INGOT_FAIL("chat template: ", tok.name(), ": the tokenizer's chat_template is not one of the natively rendered "
             "families (llama3, chatml, qwen3); name one explicitly");
}

std::string chat_template_jinja(ChatFormat format) {
  switch (format) {
    case ChatFormat::Llama3:
      return "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
             "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
             "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
    case ChatFormat::ChatML:
      return "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
             "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
             "{% endif %}";
    case ChatFormat::Alpaca:
      return "{% set ns = namespace(system='') %}{% for message in messages %}{% if message['role'] == 'system' %}"
             "{% set ns.system = message['content'] %}{% elif message['role'] == 'user' %}{% if ns.system %}"
             "{{ ns.system + '\\n\\n' }}{% else %}{{ 'Below is an instruction that describes a task. Write a "
             "response that appropriately completes the request.\\n\\n' }}{% endif %}{{ '### Instruction:\\n' + "
             "message['content'] + '\\n\\n### Response:\\n' }}{% else %}{{ message['content'] + eos_token }}"
             "{% if not loop.last %}{{ '\\n\\n' }}{% endif %}{% endif %}{% endfor %}";
    case ChatFormat::Qwen3:
      return "";
  }
  return "";
}

std::vector<ChatSegment> render_chat(const ChatTemplate& t, std::span<const ChatMessage> messages,
                                     const ChatOptions& opts) {
  INGOT_CHECK(!messages.empty(), "chat: the conversation has no messages");
  for (size_t i = 0; i < messages.size(); ++i) check_role(messages[i], i);
  std::vector<ChatSegment> out;
  auto prompt = [&](std::string s) {
    if (s.empty()) return;
    if (!out.empty() && !out.back().train) out.back().text += s;
    else out.push_back({std::move(s), false});
  };
  auto train = [&](std::string s) {
    if (s.empty()) return;
    if (!out.empty() && out.back().train) out.back().text += s;
    else out.push_back({std::move(s), true});
  };
  switch (t.format) {
    case ChatFormat::Llama3:
      prompt(t.bos);
      for (const auto& m : messages) {
        prompt("<|start_header_id|>" + m.role + "<|end_header_id|>\n\n");
        if (m.role == "assistant") train(trim(m.content) + "<|eot_id|>");
        else prompt(trim(m.content) + "<|eot_id|>");
      }
      if (opts.add_generation_prompt || t.always_generation_prompt)
        prompt("<|start_header_id|>assistant<|end_header_id|>\n\n");
      break;
    case ChatFormat::ChatML:
      for (const auto& m : messages) {
        prompt("<|im_start|>" + m.role + "\n");
        if (m.role == "assistant") train(m.content + "<|im_end|>");
        else prompt(m.content + "<|im_end|>");
        prompt("\n");
      }
      if (opts.add_generation_prompt) prompt("<|im_start|>assistant\n");
      break;
    case ChatFormat::Qwen3: {
      // Mirrors Qwen3's template without tools: the last user message is the "query"; assistant turns after
      // it show their reasoning (an empty <think> block for the final one), earlier ones only their answer.
      size_t last_query = messages.size() - 1;
      for (size_t i = messages.size(); i-- > 0;)
        if (messages[i].role == "user") {
          last_query = i;
          break;
        }
      for (size_t i = 0; i < messages.size(); ++i) {
        const auto& m = messages[i];
        if (m.role != "assistant") {
          prompt("<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n");
          continue;
        }
        std::string content = m.content, reasoning;
        size_t close = content.rfind("</think>");
        if (close != std::string::npos) {
          std::string before = content.substr(0, content.find("</think>"));
          size_t open = before.rfind("<think>");
          reasoning = trim(open == std::string::npos ? before : before.substr(open + 7), true, true, true);
          content = trim(content.substr(close + 8), true, false, true);
        }
        prompt("<|im_start|>assistant\n");
        bool last = i + 1 == messages.size();
        if (i > last_query && (last || !reasoning.empty()))
          train("<think>\n" + reasoning + "\n</think>\n\n" + trim(content, true, false, true));
        else
          train(content);
        train("<|im_end|>");
        prompt("\n");
      }
      if (opts.add_generation_prompt) prompt("<|im_start|>assistant\n");
      break;
    }
    case ChatFormat::Alpaca: {
      std::string system, pending_user;
      for (const auto& m : messages) {
        if (m.role == "system") {
          system = m.content;
        } else if (m.role == "user") {
          std::string head = system.empty() ? "Below is an instruction that describes a task. Write a response "
                                              "that appropriately completes the request.\n\n"
                                            : system + "\n\n";
          prompt(head + "### Instruction:\n" + m.content + "\n\n### Response:\n");
        } else {
          train(m.content + t.eos);
          prompt("\n\n");
        }
      }
      // The separator after the last response is not part of the template.
      if (!out.empty() && !out.back().train && out.back().text.ends_with("\n\n") && messages.back().role == "assistant") {
        out.back().text.resize(out.back().text.size() - 2);
        if (out.back().text.empty()) out.pop_back();
      }
      break;
    }
  }
  return out;
}

std::string render_chat_text(const ChatTemplate& tmpl, std::span<const ChatMessage> messages,
                             const ChatOptions& opts) {
  std::string s;
  for (const auto& seg : render_chat(tmpl, messages, opts)) s += seg.text;
  return s;
}

TokenizedChat tokenize_chat(const Tokenizer& tok, const ChatTemplate& tmpl, std::span<const ChatMessage> messages,
                            const ChatOptions& opts) {
  TokenizedChat out;
  for (const auto& seg : render_chat(tmpl, messages, opts)) {
    std::vector<int32_t> ids = tok.encode(seg.text);
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    if (seg.train) out.labels.insert(out.labels.end(), ids.begin(), ids.end());
    else out.labels.insert(out.labels.end(), ids.size(), kIgnoreIndex);
  }
  return out;
}

}  // namespace ingot::recipes
