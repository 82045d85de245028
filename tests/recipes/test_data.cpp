#include "recipes/data.h"
#include "tests/testing.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace ingot::recipes {
namespace {

using ingot::testing::error_of;

std::string row_text(const Tensor& batch, int64_t row) {
  std::string s;
  for (int64_t t = 0; t < batch.size(1); ++t) s.push_back(static_cast<char>(batch.item_at(row * batch.size(1) + t)));
  return s;
}

const std::string kText =
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; "
    "and darkness was upon the face of the deep.";

TEST(TextDataset, TokensAreBytesAndTheValidationSplitIsTheTail) {
  TextDataset d = TextDataset::from_text("abcdefgh\xc3\xa9!", 0.2);  // "é" is two bytes
  EXPECT_EQ(d.vocab_size(), 256);
  ASSERT_EQ(d.tokens(Split::Train).size(), 9u);
  ASSERT_EQ(d.tokens(Split::Val).size(), 2u);
  EXPECT_EQ(d.tokens(Split::Train)[0], 'a');
  EXPECT_EQ(d.tokens(Split::Train)[8], 0xc3);
  EXPECT_EQ(d.tokens(Split::Val)[0], 0xa9);
  EXPECT_EQ(d.tokens(Split::Val)[1], '!');
}

TEST(TextDataset, InvalidUtf8IsRejectedWithItsOffsetAndLine) {
  std::string msg = error_of([] { TextDataset::from_text("ok\nbad \xff here", 0.1, "corpus.txt"); });
  EXPECT_EQ(msg, "corpus.txt: is not UTF-8 text (invalid byte 0xff at byte offset 7, line 2)");
  EXPECT_NE(error_of([] { TextDataset::from_text("trunc \xe2\x82", 0.1); }).find("byte offset 6"), std::string::npos);
  EXPECT_NE(error_of([] { TextDataset::from_text("overlong \xc0\xaf", 0.1); }).find("byte offset 9"),
            std::string::npos);
}

TEST(TextDataset, EmptyOrMissingFilesAreNamed) {
  EXPECT_EQ(error_of([] { TextDataset::from_text("", 0.1, "empty.txt"); }), "empty.txt: is empty");
  std::string msg = error_of([] { TextDataset::from_file("/nonexistent/kjv.txt", 0.1); });
  EXPECT_EQ(msg.rfind("/nonexistent/kjv.txt: cannot open text file", 0), 0u) << msg;
}

TEST(BatchSampler, BatchesAreAPureFunctionOfSeedAndIndex) {
  TextDataset d = TextDataset::from_text(kText, 0.1);
  BatchSampler a(d, Split::Train, 4, 8, 1234), b(d, Split::Train, 4, 8, 1234), other(d, Split::Train, 4, 8, 99);
  Tensor a0 = a.next(), a1 = a.next();
  EXPECT_EQ(a0.shape(), (Shape{4, 9}));
  EXPECT_EQ(a0.dtype(), DType::i64);
  EXPECT_EQ(a0.to_vector(), b.batch(0).to_vector());
  EXPECT_EQ(a1.to_vector(), b.batch(1).to_vector());
  EXPECT_NE(a0.to_vector(), a1.to_vector());
  EXPECT_NE(a0.to_vector(), other.batch(0).to_vector());
  // Resuming at a position continues the same sequence.
  b.set_position(1);
  EXPECT_EQ(b.next().to_vector(), a1.to_vector());
  EXPECT_EQ(b.position(), 2);
}

TEST(BatchSampler, RowsAreContiguousWindowsOfTheirSplit) {
  std::string train(300, 'a'), val(100, 'z');
  for (size_t i = 0; i < train.size(); ++i) train[i] = static_cast<char>('a' + (i * 7) % 26);
  TextDataset d = TextDataset::from_text(train + val, 0.25);
  BatchSampler ts(d, Split::Train, 16, 10, 5), vs(d, Split::Val, 16, 10, 5);
  for (int64_t i = 0; i < 3; ++i) {
    Tensor tb = ts.batch(i), vb = vs.batch(i);
    for (int64_t r = 0; r < 16; ++r) {
      EXPECT_NE(train.find(row_text(tb, r)), std::string::npos) << row_text(tb, r);
      EXPECT_EQ(row_text(vb, r), std::string(11, 'z'));
    }
  }
}

TEST(BatchSampler, StartsCoverTheWholeSplit) {
  std::string text;
  for (int i = 0; i < 40; ++i) text.push_back(static_cast<char>('A' + i));
  TextDataset d = TextDataset::from_text(text, 0.0);
  BatchSampler s(d, Split::Train, 8, 4, 7);
  std::vector<bool> seen(36, false);
  for (int64_t i = 0; i < 40; ++i) {
    Tensor b = s.batch(i);
    for (int64_t r = 0; r < 8; ++r) seen[static_cast<size_t>(b.item_at(r * 5) - 'A')] = true;
  }
  for (size_t k = 0; k < seen.size(); ++k) EXPECT_TRUE(seen[k]) << "window start " << k << " never drawn";
}

TEST(BatchSampler, SplitShorterThanAWindowIsAnErrorNamingTheText) {
  TextDataset d = TextDataset::from_text(kText, 0.05, "tiny.txt");
  std::string msg = error_of([&] { BatchSampler(d, Split::Val, 2, 64, 0); });
  EXPECT_NE(msg.find("tiny.txt: the validation split has 7 tokens, fewer than block_size + 1 = 65"), std::string::npos)
      << msg;
}

}  // namespace
}  // namespace ingot::recipes
