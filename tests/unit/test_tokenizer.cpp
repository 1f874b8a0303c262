// The tiktoken BPE on hand-made vocabularies (merge order, errors); agreement with tiktoken on
// real text is tests/python/test_tokenizer.py.
#include <fstream>

#include <gtest/gtest.h>

#include "core/error.h"
#include "data/text/llama3_tokenizer.h"
#include "data/text/tiktoken.h"
#include "test_support.h"

namespace mgbench::text {
namespace {

/// Writes a tiktoken file of tokens (rank = position); returns its path.
std::string write_vocab(const test::TempDir& dir, const std::vector<std::string>& tokens,
                        const char* name = "v.model") {
  static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::ofstream out(dir.file(name));
  for (std::size_t r = 0; r < tokens.size(); ++r) {
    const std::string& t = tokens[r];
    std::string enc;
    for (std::size_t i = 0; i < t.size(); i += 3) {
      const auto byte = [&](std::size_t k) { return k < t.size() ? static_cast<unsigned char>(t[k]) : 0u; };
      const unsigned v = (byte(i) << 16) | (byte(i + 1) << 8) | byte(i + 2);
      enc += b64[(v >> 18) & 63];
      enc += b64[(v >> 12) & 63];
      enc += i + 1 < t.size() ? b64[(v >> 6) & 63] : '=';
      enc += i + 2 < t.size() ? b64[v & 63] : '=';
    }
    out << enc << " " << r << "\n";
  }
  return dir.file(name);
}

TEST(Tiktoken, MergesLowestRankFirstLeftmostOnTies) {
  test::TempDir dir;
  // ranks: a b c ab bc abc
  const TiktokenBpe bpe(write_vocab(dir, {"a", "b", "c", "ab", "bc", "abc", " "}), kLlama3Pattern);
  EXPECT_EQ(bpe.encode("abc"), (std::vector<std::int32_t>{5}));  // whole piece
  // "abcab": ab(3) | bc(4) | ca(-) | ab(3): the leftmost ab first, then the right ab, then abc.
  EXPECT_EQ(bpe.encode("abcab"), (std::vector<std::int32_t>{5, 3}));
  EXPECT_EQ(bpe.encode("cba"), (std::vector<std::int32_t>{2, 1, 0}));
  EXPECT_EQ(bpe.encode("abc abc"), (std::vector<std::int32_t>{5, 6, 5}));  // " abc" is one piece: " " + abc
  EXPECT_EQ(bpe.decode({5, 3, 6}), "abcab ");
  EXPECT_TRUE(bpe.encode("").empty());
  EXPECT_THROW(bpe.decode({99}), std::out_of_range);
  // A byte the vocabulary lacks cannot be encoded: a clear error, not a silent drop.
  test::expect_error<DataError>([&] { bpe.encode("abd"); }, {"no token"});
}

TEST(Tiktoken, BadFilesNameFileAndLine) {
  test::TempDir dir;
  { std::ofstream(dir.file("b64.model")) << "YQ== 0\nnot-base64! 1\n"; }
  test::expect_error<DataError>([&] { TiktokenBpe(dir.file("b64.model"), kLlama3Pattern); },
                                {"b64.model' line 2", "base64"});
  { std::ofstream(dir.file("rank.model")) << "YQ== 0\nYg== x\n"; }
  test::expect_error<DataError>([&] { TiktokenBpe(dir.file("rank.model"), kLlama3Pattern); },
                                {"rank.model' line 2", "'x'"});
  { std::ofstream(dir.file("dup.model")) << "YQ== 0\nYQ== 1\n"; }
  test::expect_error<DataError>([&] { TiktokenBpe(dir.file("dup.model"), kLlama3Pattern); }, {"line 2", "repeated"});
  { std::ofstream(dir.file("empty.model")) << "\n"; }
  test::expect_error<DataError>([&] { TiktokenBpe(dir.file("empty.model"), kLlama3Pattern); }, {"no tokens"});
  test::expect_error<DataError>([&] { TiktokenBpe(dir.file("none.model"), kLlama3Pattern); }, {"none.model", "open"});
  test::expect_error<ConfigError>([&] { TiktokenBpe(write_vocab(dir, {"a"}), "(unclosed"); }, {"pattern"});
}

TEST(Tiktoken, InvalidUtf8IsAnError) {
  test::TempDir dir;
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  const TiktokenBpe bpe(write_vocab(dir, bytes), kLlama3Pattern);
  EXPECT_EQ(bpe.encode("ok").size(), 2u);
  test::expect_error<DataError>([&] { bpe.encode("ok \xff\xfe"); }, {"byte 3", "UTF-8"});
}

TEST(Llama3Tokenizer, SpecialTokensFollowTheBaseVocabulary) {
  const std::string path = test::shared_data_dir() + "/llama3/tokenizer.model";
  MGBENCH_REQUIRE_INPUTS(path);
  const Llama3Tokenizer tok(path);
  EXPECT_EQ(tok.bos_id(), 128000);
  EXPECT_EQ(tok.eos_id(), 128001);
  EXPECT_EQ(tok.pad_id(), 128004);
  EXPECT_EQ(tok.start_header_id(), 128006);
  EXPECT_EQ(tok.end_header_id(), 128007);
  EXPECT_EQ(tok.eot_id(), 128009);
  EXPECT_EQ(tok.vocab_size(), 128256);
  EXPECT_EQ(tok.encode("Hello world!", true, true), (std::vector<std::int32_t>{128000, 9906, 1917, 0, 128001}));
  EXPECT_EQ(tok.decode({128006}), "<|start_header_id|>");
  EXPECT_EQ(tok.bpe().special("<|reserved_special_token_247|>"), 128255);
}

}  // namespace
}  // namespace mgbench::text
