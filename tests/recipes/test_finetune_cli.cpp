// The fine-tuning, eval and generate recipes through the `ingot` program (bin/ingot beside bin/ingot_tests),
// run from the source tree so the built-in configs find their fixtures.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "runtime/file_util.h"
#include "tests/shell.h"
#include "tests/testing.h"

namespace ingot {
namespace {

namespace fs = std::filesystem;

using Result = ingot::testing::ShellResult;  // stdout and stderr together

// Runs `ingot <args>` in the source tree.
Result ingot(const std::string& args) {
  const fs::path bin = fs::read_symlink("/proc/self/exe").parent_path() / "ingot";
  return ingot::testing::run_shell("cd '" + std::string(INGOT_SOURCE_DIR) + "' && '" + bin.string() + "' " + args +
                                   " 2>&1");
}

bool has(const Result& r, const std::string& needle) { return r.output.find(needle) != std::string::npos; }

// A checkpoint whose weights alone do not fit on the GPU (here under a 0.5 MiB allocator limit) fails naming the
// allocation and says what shrinks or spreads them (recipes/memory_advice.h), not a step's keys.
TEST(FinetuneCli, OnTheGpuWeightsThatDoNotFitSayWhatShrinksThem) {
  INGOT_REQUIRE_CUDA();
  TempDir dir("ingot_ft_oom");
  const fs::path bin = fs::read_symlink("/proc/self/exe").parent_path() / "ingot";
  Result r = ingot::testing::run_shell("cd '" + std::string(INGOT_SOURCE_DIR) + "' && INGOT_CUDA_MEMORY_LIMIT_GIB=0.0005 '" +
                                       bin.string() + "' run llama_lora_finetune device=cuda max_steps=1 output_dir=" +
                                       dir.file("run") + " 2>&1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  for (const char* says : {"CUDA out of memory on cuda:0", "weights (", "do not fit on the GPU; to hold them in less "
                           "memory, set:", "lora.quantize_base=nf4", "distributed.zero_stage=3"})
    EXPECT_TRUE(has(r, says)) << says << "\n" << r.output;
  EXPECT_FALSE(has(r, "to use less GPU memory, set:")) << r.output;  // not a step's advice
}

TEST(FinetuneCli, LsListsTheRecipesAndTheirConfigs) {
  Result r = ingot("ls");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* s : {"full_finetune  fine-tune every weight", "lora_finetune  train LoRA adapters", "eval  perplexity",
                        "generate  continue a prompt", "    gpt2_full_finetune ", "    llama_full_finetune ",
                        "    llama_lora_finetune ", "    qwen2_lora_finetune ", "    qwen3_lora_finetune ",
                        "    eval_perplexity ",
                        "    generate_text "})
    EXPECT_TRUE(has(r, s)) << s << "\n" << r.output;
}

TEST(FinetuneCli, CatValidateAndRunHelpDescribeTheConfigs) {
  Result r = ingot("cat qwen2_lora_finetune");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r, "recipe: lora_finetune")) << r.output;
  for (const char* c : {"gpt2_full_finetune", "llama_full_finetune", "llama_lora_finetune", "qwen2_lora_finetune",
                        "qwen3_lora_finetune", "eval_perplexity", "generate_text"}) {
    r = ingot(std::string("validate ") + c + " device=cpu");
    EXPECT_EQ(r.exit_code, 0) << c << ": " << r.output;
  }
  r = ingot("run lora_finetune --help");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* key : {"lora.target_modules", "lora.merge_on_export", "data.chat_template", "train.epochs",
                          "model.path", "tokenizer.path", "export.max_shard_mb"})
    EXPECT_TRUE(has(r, key)) << key;
  r = ingot("run generate --help");
  EXPECT_TRUE(has(r, "generate.top_p")) << r.output;
}

TEST(FinetuneCli, RunFineTunesThenEvalAndGenerateUseTheExport) {
  TempDir dir("ingot_ft_cli");
  const std::string out = dir.file("run");
  Result r = ingot("run llama_lora_finetune device=cpu max_steps=4 train.log_every=2 output_dir=" + out +
                   " --summary " + dir.file("s.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r, "step 4/4 | loss")) << r.output;
  EXPECT_TRUE(fs::is_regular_file(out + "/adapter/adapter_config.json"));
  EXPECT_TRUE(fs::is_regular_file(out + "/hf/model.safetensors"));
  EXPECT_TRUE(fs::is_regular_file(dir.file("s.json")));
  // The export carries the chat template it was trained with (data.chat_template: llama3), so its own
  // tokenizer renders prompts the same way.
  std::ifstream tc(out + "/hf/tokenizer_config.json");
  const std::string tokenizer_config((std::istreambuf_iterator<char>(tc)), std::istreambuf_iterator<char>());
  EXPECT_NE(tokenizer_config.find("\"chat_template\": \"{{ bos_token }}{% for message in messages %}{{ "
                                  "'<|start_header_id|>'"),
            std::string::npos)
      << tokenizer_config;
  r = ingot("validate generate_text device=cpu generate.chat_template=auto model.path=" + out + "/hf tokenizer.path=" +
            out + "/hf");
  EXPECT_EQ(r.exit_code, 0) << r.output;

  r = ingot("run eval_perplexity device=cpu model.path=" + out + "/hf tokenizer.path=" + out + "/hf");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r, "eval | loss")) << r.output;
  r = ingot("run eval_perplexity device=cpu model.path=tests/fixtures/hf/llama_tiny model.adapter=" + out + "/adapter");
  EXPECT_EQ(r.exit_code, 0) << r.output;

  // The completion is printed on stdout; the log line on stderr.
  const std::string bin = (fs::read_symlink("/proc/self/exe").parent_path() / "ingot").string();
  const Result gen = ingot::testing::run_shell("cd '" + std::string(INGOT_SOURCE_DIR) + "' && '" + bin +
                                              "' run generate_text device=cpu generate.max_new_tokens=5 model.path=" +
                                              out + "/hf 2>/dev/null");
  const std::string& stdout_text = gen.output;
  EXPECT_EQ(gen.exit_code, 0);
  EXPECT_FALSE(stdout_text.empty());
  EXPECT_EQ(stdout_text.find("generate |"), std::string::npos) << stdout_text;
}

TEST(FinetuneCli, ARecipeNameRunSaysWhichBuiltInConfigItTookAndAKeyTypoPointsAtItsHelp) {
  TempDir dir("ingot_ft_cli_banner");
  Result r = ingot("run lora_finetune device=cpu max_steps=1 logging.plot=false output_dir=" + dir.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r, "configs/llama_lora_finetune.yaml (recipe 'lora_finetune': its built-in config "
                     "'llama_lora_finetune' (also: qwen2_lora_finetune, qwen3_lora_finetune)) | output_dir " + dir.file("run")))
      << r.output;
  r = ingot("validate lora_finetune device=cpu lora.rnk=4");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r, "unknown key 'lora.rnk'; did you mean 'lora.rank'? (`ingot run lora_finetune --help` lists every "
                     "key)"))
      << r.output;
}

TEST(FinetuneCli, ValidateFindsAChatTemplateTheTokenizerDoesNotHave) {
  Result r = ingot("validate llama_lora_finetune device=cpu data.chat_template=auto");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r, "data.chat_template: chat template: ")) << r.output;
  EXPECT_TRUE(has(r, "has no chat_template in tokenizer_config.json; name one (llama3, chatml, qwen3, alpaca)"))
      << r.output;
  r = ingot("validate generate_text device=cpu generate.chat_template=auto model.path=tests/fixtures/hf/llama_tiny "
            "tokenizer.path=tests/fixtures/data/tokenizer");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r, "generate.chat_template: chat template: ")) << r.output;
}

TEST(FinetuneCli, AnEmptyDataFileIsFoundByValidate) {
  TempDir dir("ingot_ft_cli_empty");
  std::ofstream(dir.file("empty.jsonl")) << "";
  Result r = ingot("validate llama_lora_finetune device=cpu data.path=" + dir.file("empty.jsonl"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r, "data.path: '" + dir.file("empty.jsonl") + "' is empty")) << r.output;
}

TEST(FinetuneCli, BadInputsExitNonZeroNamingTheProblemAndWriteNothing) {
  TempDir dir("ingot_ft_cli_bad");
  const std::string out = dir.file("run");
  Result r = ingot("run qwen2_lora_finetune device=cpu output_dir=" + out + " model.path=" + dir.file("nope"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r, "model.path: no such checkpoint directory")) << r.output;

  r = ingot("run qwen2_lora_finetune device=cpu output_dir=" + out + " 'lora.target_modules=[q_proj, attn]'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r, "lora.target_modules: unknown module 'attn'")) << r.output;

  r = ingot("run qwen2_lora_finetune device=cpu output_dir=" + out + " data.chat_template=zephyr");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r, "data.chat_template: expected one of")) << r.output;

  std::ofstream(dir.file("bad.jsonl")) << "{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": \n";
  r = ingot("run qwen2_lora_finetune device=cpu output_dir=" + out + " data.path=" + dir.file("bad.jsonl"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(has(r, "bad.jsonl:2: malformed JSON")) << r.output;
  EXPECT_FALSE(fs::exists(out)) << "nothing may be written for bad inputs";
}

}  // namespace
}  // namespace ingot
