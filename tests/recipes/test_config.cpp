#include "recipes/config.h"

#include <gtest/gtest.h>

#include <string>

namespace ingot::recipes {
namespace {

ConfigSchema test_schema() {
  using T = ConfigType;
  ConfigSchema s;
  s.add(ConfigKey::of(T::Int, "seed", "0", "random seed"));
  s.add(ConfigKey::of(T::String, "device", "auto", "where to run").one_of({"auto", "cpu", "cuda"}));
  s.add(ConfigKey::of(T::Float, "train.lr", "3e-4", "learning rate").at_least(0));
  s.add(ConfigKey::of(T::Int, "train.batch_size", "8", "batch").at_least(1));
  s.add(ConfigKey::of(T::Bool, "compile.enabled", "false", "compile"));
  s.add(ConfigKey::required_key(T::String, "data.path", "text file"));
  return s;
}

// Runs `fn`, expects a ConfigError, and returns its message.
template <class F>
std::string config_error(F&& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

TEST(Config, AnotherFrameworksKeyNameSuggestsOursInTheSameSection) {
  ConfigSchema s = test_schema();
  EXPECT_EQ(s.suggest("train.learning_rate"), "train.lr");
  EXPECT_EQ(s.suggest("learning_rate"), "train.lr");
  EXPECT_EQ(s.suggest("train.per_device_train_batch_size"), "train.batch_size");
  EXPECT_EQ(s.suggest("train.momentum"), "");
}

TEST(Config, AChoiceWrittenAsAnAliasOrWithATypoIsSuggested) {
  ConfigSchema s = test_schema();
  s.add(ConfigKey::of(ConfigType::String, "dtype", "f32", "precision").one_of({"f32", "bf16"}));
  std::string msg = config_error([&] {
    Config c = Config::parse("dtype: bfloat16\ndata: {path: x}\n", "q.yaml");
    c.validate(s);
  });
  EXPECT_NE(msg.find("q.yaml:1:8: dtype: expected one of f32, bf16, got 'bfloat16'; did you mean 'bf16'?"),
            std::string::npos)
      << msg;
  msg = config_error([&] {
    Config c = Config::parse("device: cudaa\ndata: {path: x}\n", "q.yaml");
    c.validate(s);
  });
  EXPECT_NE(msg.find("got 'cudaa'; did you mean 'cuda'?"), std::string::npos) << msg;
}

TEST(Config, AnUnknownKeyPointsAtTheHelpOfItsOwnRecipe) {
  ConfigSchema s = test_schema();
  s.add(ConfigKey::of(ConfigType::String, "recipe", "lora_finetune", "the recipe"));
  std::string msg = config_error([&] {
    Config c = Config::parse("lora_rnk: 4\ndata: {path: x}\n", "q.yaml");
    c.validate(s);
  });
  EXPECT_NE(msg.find("(`ingot run lora_finetune --help` lists every key)"), std::string::npos) << msg;
}

TEST(Config, NestedMappingsBecomeDottedKeysWithTypedValues) {
  Config c = Config::parse(
      "seed: 7\ntrain:\n  lr: 1.5e-3\n  batch_size: 4\ncompile:\n  enabled: yes\n"
      "data: {path: data/kjv.txt}\n",
      "q.yaml");
  EXPECT_EQ(c.get_int("seed"), 7);
  EXPECT_DOUBLE_EQ(c.get_double("train.lr"), 1.5e-3);
  EXPECT_DOUBLE_EQ(c.get_double("train.batch_size"), 4.0);  // integers are numbers too
  EXPECT_TRUE(c.get_bool("compile.enabled"));
  EXPECT_EQ(c.get_string("data.path"), "data/kjv.txt");
  EXPECT_EQ(c.origin("train.lr").str(), "q.yaml:3:7");
}

TEST(Config, DottedKeysInTheFileAreTheSameAsNestedOnes) {
  Config c = Config::parse("train.lr: 0.01\n", "q.yaml");
  EXPECT_DOUBLE_EQ(c.get_double("train.lr"), 0.01);
}

TEST(Config, ValidateFillsDefaultsForAbsentKeys) {
  Config c = Config::parse("data:\n  path: a.txt\n", "q.yaml");
  c.validate(test_schema());
  EXPECT_EQ(c.get_int("train.batch_size"), 8);
  EXPECT_EQ(c.get_string("device"), "auto");
  EXPECT_FALSE(c.get_bool("compile.enabled"));
  EXPECT_EQ(c.origin("device").str(), "default");
}

TEST(Config, OverridesReplaceFileValuesAndAreNamedInErrors) {
  Config c = Config::parse("train:\n  lr: 0.1\ndata:\n  path: a.txt\n", "q.yaml");
  c.apply_override("train.lr=2e-4");
  c.apply_override("compile.enabled=true");
  c.validate(test_schema());
  EXPECT_DOUBLE_EQ(c.get_double("train.lr"), 2e-4);
  EXPECT_TRUE(c.get_bool("compile.enabled"));

  Config bad = Config::parse("data:\n  path: a.txt\n", "q.yaml");
  bad.apply_override("train.batch_size=many");
  std::string msg = config_error([&] { bad.validate(test_schema()); });
  EXPECT_NE(msg.find("command-line override 'train.batch_size=many'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.batch_size: expected an integer, got 'many'"), std::string::npos) << msg;
}

TEST(Config, OverrideOfASectionReplacesEverythingBelowIt) {
  Config c = Config::parse("train:\n  lr: 0.1\n  batch_size: 3\n", "q.yaml");
  c.apply_override("train=5");
  EXPECT_FALSE(c.has("train.lr"));
  EXPECT_FALSE(c.has("train.batch_size"));
  EXPECT_EQ(c.get_int("train"), 5);
}

TEST(Config, MalformedOverridesAreRejected) {
  Config c;
  EXPECT_NE(config_error([&] { c.apply_override("train.lr"); }).find("expected key=value"), std::string::npos);
  EXPECT_NE(config_error([&] { c.apply_override("train..lr=1"); }).find("is not a key path"), std::string::npos);
  EXPECT_NE(config_error([&] { c.apply_override("=1"); }).find("is not a key path"), std::string::npos);
  EXPECT_NE(config_error([&] { c.apply_override("train.lr=[1, 2"); }).find("invalid value"), std::string::npos);
}

TEST(Config, UnknownKeyNamesFileLineColumnAndSuggestsTheClosestKey) {
  Config c = Config::parse("data:\n  path: a.txt\ntrain:\n  lrr: 0.1\n", "q.yaml");
  std::string msg = config_error([&] { c.validate(test_schema()); });
  EXPECT_NE(msg.find("q.yaml:4:3: unknown key 'train.lrr'; did you mean 'train.lr'?"), std::string::npos) << msg;
}

TEST(Config, KeyInTheWrongSectionSuggestsTheRightSection) {
  Config c = Config::parse("data:\n  path: a.txt\nlr: 0.1\n", "q.yaml");
  std::string msg = config_error([&] { c.validate(test_schema()); });
  EXPECT_NE(msg.find("q.yaml:3:1: unknown key 'lr'; did you mean 'train.lr'?"), std::string::npos) << msg;
}

TEST(Config, UnknownOverrideKeySuggestsTheClosestKey) {
  Config c = Config::parse("data:\n  path: a.txt\n", "q.yaml");
  c.apply_override("trian.batch_size=4");
  std::string msg = config_error([&] { c.validate(test_schema()); });
  EXPECT_NE(msg.find("command-line override 'trian.batch_size=4': unknown key 'trian.batch_size'; did you mean "
                     "'train.batch_size'?"),
            std::string::npos)
      << msg;
}

TEST(Config, WrongTypeNamesFileLineColumnAndKeyPath) {
  Config c = Config::parse("data:\n  path: a.txt\ntrain:\n  batch_size: 2.5\n", "q.yaml");
  std::string msg = config_error([&] { c.validate(test_schema()); });
  EXPECT_EQ(msg, "q.yaml:4:15: train.batch_size: expected an integer, got '2.5'");

  Config b = Config::parse("data:\n  path: a.txt\ncompile:\n  enabled: maybe\n", "q.yaml");
  EXPECT_EQ(config_error([&] { b.validate(test_schema()); }),
            "q.yaml:4:12: compile.enabled: expected true or false, got 'maybe'");

  Config l = Config::parse("data:\n  path: [a, b]\n", "q.yaml");
  EXPECT_EQ(config_error([&] { l.validate(test_schema()); }), "q.yaml:2:9: data.path: expected a string, got a list");

  Config n = Config::parse("data:\n  path: a.txt\ntrain:\n  lr:\n", "q.yaml");
  EXPECT_EQ(config_error([&] { n.validate(test_schema()); }),
            "q.yaml:4:3: train.lr: expected a number, got null (no value)");
}

TEST(Config, ValuesOutsideBoundsOrChoicesNameTheAllowedRange) {
  Config c = Config::parse("data:\n  path: a.txt\ntrain:\n  batch_size: 0\n", "q.yaml");
  EXPECT_EQ(config_error([&] { c.validate(test_schema()); }),
            "q.yaml:4:15: train.batch_size: expected an integer >= 1, got '0'");
  Config d = Config::parse("data:\n  path: a.txt\ndevice: gpu-cluster\n", "q.yaml");
  EXPECT_EQ(config_error([&] { d.validate(test_schema()); }),
            "q.yaml:3:9: device: expected one of auto, cpu, cuda, got 'gpu-cluster'");
}

TEST(Config, MissingRequiredKeyIsNamed) {
  Config c = Config::parse("seed: 1\n", "q.yaml");
  EXPECT_EQ(config_error([&] { c.validate(test_schema()); }), "q.yaml: missing required key 'data.path': text file");
}

TEST(Config, AllErrorsAreReportedTogetherInFileOrder) {
  Config c = Config::parse("seed: x\ndata:\n  path: a.txt\ntrain:\n  lrr: 1\n", "q.yaml");
  std::string msg = config_error([&] { c.validate(test_schema()); });
  size_t first = msg.find("q.yaml:1:7: seed"), second = msg.find("q.yaml:5:3: unknown key 'train.lrr'");
  EXPECT_EQ(msg.rfind("2 config errors:", 0), 0u) << msg;
  ASSERT_NE(first, std::string::npos) << msg;
  ASSERT_NE(second, std::string::npos) << msg;
  EXPECT_LT(first, second);
}

TEST(Config, InvalidYamlNamesTheLine) {
  std::string msg = config_error([] { Config::parse("train:\n  lr: [1, 2\nseed: 3\n", "q.yaml"); });
  EXPECT_EQ(msg.rfind("q.yaml:", 0), 0u) << msg;
  EXPECT_NE(msg.find("invalid YAML"), std::string::npos) << msg;
  EXPECT_NE(config_error([] { Config::parse("- 1\n- 2\n", "q.yaml"); }).find("q.yaml:1:1: expected a mapping"),
            std::string::npos);
}

TEST(Config, DuplicateKeysNameBothPlaces) {
  std::string msg = config_error([] { Config::parse("seed: 1\ntrain:\n  lr: 1\nseed: 2\n", "q.yaml"); });
  EXPECT_EQ(msg, "q.yaml:4:1: duplicate key 'seed' (first set at q.yaml:1:1)");
  msg = config_error([] { Config::parse("train:\n  lr: 1\ntrain.lr: 2\n", "q.yaml"); });
  EXPECT_EQ(msg, "q.yaml:3:1: duplicate key 'train.lr' (first set at q.yaml:2:3)");
}

TEST(Config, MissingFileIsNamed) {
  std::string msg = config_error([] { Config::load("/nonexistent/dir/q.yaml"); });
  EXPECT_EQ(msg.rfind("/nonexistent/dir/q.yaml: cannot open config file", 0), 0u) << msg;
}

TEST(Config, SequencesKeepTheirItems) {
  Config c = Config::parse("files: [a.txt, b.txt]\n", "q.yaml");
  ASSERT_TRUE(c.value("files").is_sequence);
  EXPECT_EQ(c.value("files").items, (std::vector<std::string>{"a.txt", "b.txt"}));
}

TEST(Config, ResolvedYamlParsesBackToTheSameValues) {
  Config c = Config::parse("seed: 3\ntrain:\n  lr: 0.5\ndata:\n  path: 'x y.txt'\nfiles: [a, b]\n", "q.yaml");
  c.apply_override("compile.enabled=true");
  Config back = Config::parse(c.to_yaml(), "resolved.yaml");
  ASSERT_EQ(back.values().size(), c.values().size()) << c.to_yaml();
  for (const auto& [path, v] : c.values()) {
    EXPECT_EQ(back.value(path).text, v.text) << path;
    EXPECT_EQ(back.value(path).items, v.items) << path;
  }
}

TEST(ConfigSchema, HelpListsEveryKeyWithTypeDefaultAndChoices) {
  std::string help = test_schema().help();
  for (const char* key : {"seed", "device", "train.lr", "train.batch_size", "compile.enabled", "data.path"})
    EXPECT_NE(help.find(key), std::string::npos) << key;
  EXPECT_NE(help.find("[auto|cpu|cuda]"), std::string::npos) << help;
  EXPECT_NE(help.find("string (required)"), std::string::npos) << help;
  EXPECT_NE(help.find("number = 3e-4"), std::string::npos) << help;
}

TEST(ConfigSchema, FarFetchedNamesGetNoSuggestion) {
  EXPECT_EQ(test_schema().suggest("completely_different"), "");
  EXPECT_EQ(test_schema().suggest("sed"), "seed");
}

// The schema is the only place a key's default is written: a read that names its own fallback does not compile.
template <class R>
concept TakesAFallback = requires(const R& r) {
  r.i64("seed", int64_t{0});
  r.f64("train.lr", 0.0);
  r.flag("compile.enabled", false);
  r.str("device", std::string());
};
static_assert(!TakesAFallback<ConfigReader>, "ConfigReader must take each default from the schema");

TEST(ConfigReader, AnUnreadableValueGivesTheSchemaDefaultAndAnError) {
  Config c = Config::parse("seed: x\ndevice: [a]\ntrain: {lr: fast, batch_size: many}\ncompile: {enabled: maybe}\n",
                           "q.yaml");
  ConfigErrors errors;
  c.validate(test_schema(), errors);
  const ConfigReader rd(c, errors);
  EXPECT_EQ(rd.i64("seed"), 0);
  EXPECT_EQ(rd.str("device"), "auto");
  EXPECT_DOUBLE_EQ(rd.f64("train.lr"), 3e-4);
  EXPECT_EQ(rd.i64("train.batch_size"), 8);
  EXPECT_FALSE(rd.flag("compile.enabled"));
  EXPECT_EQ(rd.str("data.path"), "");  // required: no default, and its absence is reported
  for (const char* key : {"seed", "device", "train.lr", "train.batch_size", "compile.enabled", "data.path"})
    EXPECT_TRUE(errors.has_error_for(key)) << key;
}

TEST(ConfigReader, ReadsTheValidatedValues) {
  Config c = Config::parse("train: {lr: 1e-2}\ndata: {path: t.txt}\n", "q.yaml");
  c.validate(test_schema());
  ConfigErrors errors;
  const ConfigReader rd(c, errors);
  EXPECT_DOUBLE_EQ(rd.f64("train.lr"), 1e-2);
  EXPECT_EQ(rd.i64("train.batch_size"), 8);
  EXPECT_EQ(rd.str("data.path"), "t.txt");
  EXPECT_TRUE(errors.empty());
}

TEST(ConfigReader, ReadingAKeyTheSchemaDoesNotListIsAnInternalError) {
  Config c = Config::parse("data: {path: t.txt}\n", "q.yaml");
  c.validate(test_schema());
  ConfigErrors errors;
  const ConfigReader rd(c, errors);
  EXPECT_TRUE(rd.listed("train.lr"));
  EXPECT_FALSE(rd.listed("train.min_lr"));
  try {
    rd.f64("train.min_lr");
    FAIL() << "expected an internal error";
  } catch (const ConfigError& e) {
    FAIL() << "a key missing from the schema is ingot's bug, not the user's: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'train.min_lr' is read but the schema does not list it"), std::string::npos)
        << e.what();
  }
}

// The schema's type is the key's type: a resolver reading train.lr (a number) as an integer would truncate it.
TEST(ConfigReader, ReadingAKeyAsAnotherTypeThanTheSchemasIsAnInternalError) {
  Config c = Config::parse("data: {path: t.txt}\n", "q.yaml");
  c.validate(test_schema());
  ConfigErrors errors;
  const ConfigReader rd(c, errors);
  try {
    rd.i64("train.lr");
    FAIL() << "expected an internal error";
  } catch (const ConfigError& e) {
    FAIL() << "a read of the wrong type is ingot's bug, not the user's: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'train.lr' is read as type 'integer' but the schema declares 'number'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(rd.str("compile.enabled"), Error);
  EXPECT_THROW(rd.list("seed"), Error);
  EXPECT_TRUE(errors.empty());
}

TEST(ConfigReader, NeedsAValidatedConfig) {
  Config c = Config::parse("seed: 1\n", "q.yaml");
  ConfigErrors errors;
  EXPECT_THROW(ConfigReader(c, errors), Error);
}

TEST(Config, DefaultsHoldEveryKeyButTheRequiredOnes) {
  Config d = Config::defaults(test_schema());
  ASSERT_NE(d.schema(), nullptr);
  EXPECT_EQ(d.get_int("train.batch_size"), 8);
  EXPECT_EQ(d.get_string("device"), "auto");
  EXPECT_FALSE(d.has("data.path"));
}

}  // namespace
}  // namespace ingot::recipes
