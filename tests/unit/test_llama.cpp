// Safetensors I/O and the Llama model against transformers' LlamaForCausalLM
// (tests/python/make_oracles.py: tiny random checkpoints, untied / tied / sharded, fp32 logits).
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include <c10/util/ThreadLocalDebugInfo.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/error.h"
#include "host_bytes.h"
#include "models/llama.h"
#include "models/safetensors.h"
#include "models/state_dict.h"
#include "test_support.h"

namespace mgbench::models {
namespace {

TEST(Safetensors, WriteReadRoundTripAllDtypes) {
  test::TempDir dir;
  const std::vector<std::pair<std::string, torch::Tensor>> tensors{
      {"w.bf16", torch::randn({3, 5}).to(torch::kBFloat16)},
      {"w.f16", torch::randn({7}).to(torch::kHalf)},
      {"w.f32", torch::randn({2, 2, 2})},
      {"w.f64", torch::randn({1}, torch::kFloat64)},
      {"i64", torch::arange(10)},
      {"b", torch::tensor({true, false})},
      {"empty", torch::zeros({0, 4})}};
  write_safetensors(dir.file("x.safetensors"), tensors, {{"format", "pt"}});
  const SafetensorsFile f(dir.file("x.safetensors"));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.names().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const torch::Tensor back = f.tensor(name);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(back, t)) << name;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.safetensors.tmp")));
  test::expect_error<DataError>([&] { f.tensor("nope"); }, {"x.safetensors", "'nope'"});
}

TEST(Safetensors, ReadRowsReadsOneRangeOfDimZero) {
  // What a rank of a sharded model reads of a tensor: its rows, into its own memory (the file's
  // dtype: straight in; another dtype or a strided destination: converted through a host buffer).
  test::TempDir dir;
  const torch::Tensor t = torch::randn({7, 3, 5}).to(torch::kBFloat16);
  write_safetensors(dir.file("x.safetensors"), {{"t", t}, {"s", torch::tensor(2.5)}});
  const SafetensorsFile f(dir.file("x.safetensors"));
  EXPECT_EQ(f.shape("t"), (std::vector<std::int64_t>{7, 3, 5}));
  EXPECT_EQ(f.dtype("t"), torch::kBFloat16);
  torch::Tensor same = torch::empty({3, 3, 5}, torch::kBFloat16);
  f.read_rows("t", 2, same);
  EXPECT_TRUE(torch::equal(same, t.narrow(0, 2, 3)));
  torch::Tensor wider = torch::empty({4, 3, 5}, torch::kFloat32);
  f.read_rows("t", 3, wider);
  EXPECT_TRUE(torch::equal(wider, t.narrow(0, 3, 4).to(torch::kFloat32)));
  torch::Tensor strided = torch::zeros({2, 5, 3}, torch::kBFloat16).transpose(1, 2);
  f.read_rows("t", 5, strided);
  EXPECT_TRUE(torch::equal(strided, t.narrow(0, 5, 2)));
  torch::Tensor none = torch::empty({0, 3, 5}, torch::kBFloat16);
  f.read_rows("t", 7, none);  // an empty chunk (a rank past the last row)
  torch::Tensor scalar = torch::empty({}, torch::kFloat32);
  f.read_rows("s", 0, scalar);
  EXPECT_EQ(scalar.item<float>(), 2.5F);
  test::expect_error<DataError>(
      [&] {
        f.read_rows("t", 5, torch::empty({3, 3, 5}));
      },
      {"x.safetensors", "'t'", "[7, 3, 5]", "rows 5..8"});
  test::expect_error<DataError>([&] { f.read_rows("t", 0, torch::empty({1, 5, 3})); }, {"'t'", "[1, 5, 3]"});
  test::expect_error<DataError>([&] { f.read_rows("nope", 0, same); }, {"'nope'"});
}

TEST(Safetensors, AWriterTakesTheTensorsInAnyOrderAndCommitsOnlyAWholeFile) {
  // What a sharded export does: the header laid out first, each tensor written when its unit is
  // gathered. Written backwards, the file has write_safetensors' bytes.
  test::TempDir dir;
  const std::vector<std::pair<std::string, torch::Tensor>> tensors{
      {"b.weight", torch::randn({5, 3}).to(torch::kBFloat16)},
      {"a.weight", torch::randn({7})},
      {"c.bias", torch::arange(3)}};
  write_safetensors(dir.file("whole.safetensors"), tensors, {{"format", "pt"}});
  std::vector<SafetensorsWriter::Entry> entries;
  for (const auto& [name, t] : tensors) entries.push_back({name, t.scalar_type(), t.sizes().vec()});
  {
    SafetensorsWriter writer(dir.file("streamed.safetensors"), entries, {{"format", "pt"}});
    for (auto it = tensors.rbegin(); it != tensors.rend(); ++it) writer.write(it->first, it->second.t().t());
    test::expect_error<std::invalid_argument>([&] { writer.write("a.weight", tensors[1].second); }, {"twice"});
    writer.commit();
  }
  const auto bytes = [&](const char* name) {
    std::ifstream in(dir.file(name), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(bytes("streamed.safetensors"), bytes("whole.safetensors"));
  {
    SafetensorsWriter writer(dir.file("partial.safetensors"), entries, {});
    writer.write("a.weight", tensors[1].second);
    test::expect_error<std::invalid_argument>(
        [&] {
          writer.write("b.weight", torch::zeros({5, 3}));
        },
        {"'b.weight'", "Float", "BFloat16"});
    test::expect_error<std::invalid_argument>([&] { writer.write("d", torch::zeros({1})); }, {"'d'", "not announced"});
    test::expect_error<DataError>([&] { writer.commit(); }, {"partial.safetensors", "'b.weight'", "never written"});
  }
  // Uncommitted, nothing is left: neither the file nor its temporary.
  EXPECT_FALSE(std::filesystem::exists(dir.file("partial.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("partial.safetensors.tmp")));
}

TEST(Safetensors, CorruptFilesNameTheProblem) {
  test::TempDir dir;
  write_safetensors(dir.file("ok.safetensors"), {{"a", torch::randn({64})}, {"b", torch::randn({64})}});
  const auto size = std::filesystem::file_size(dir.file("ok.safetensors"));
  std::filesystem::copy_file(dir.file("ok.safetensors"), dir.file("cut.safetensors"));
  std::filesystem::resize_file(dir.file("cut.safetensors"), size - 10);
  test::expect_error<DataError>([&] { SafetensorsFile(dir.file("cut.safetensors")); },
                                {"cut.safetensors", "truncated"});
  // Bytes past the last tensor (safetensors refuses them: MetadataIncompleteBuffer); were accepted.
  std::filesystem::copy_file(dir.file("ok.safetensors"), dir.file("long.safetensors"));
  { std::ofstream(dir.file("long.safetensors"), std::ios::binary | std::ios::app) << "tail"; }
  test::expect_error<DataError>([&] { SafetensorsFile(dir.file("long.safetensors")); },
                                {"long.safetensors", "4 bytes after the last tensor"});
  EXPECT_NO_THROW(SafetensorsFile(dir.file("ok.safetensors")));
  { std::ofstream(dir.file("short.safetensors")) << "abc"; }
  test::expect_error<DataError>([&] { SafetensorsFile(dir.file("short.safetensors")); },
                                {"short.safetensors", "8-byte"});
  auto write_header = [&](const std::string& name, const std::string& json) {
    std::ofstream out(dir.file(name), std::ios::binary);
    const std::uint64_t n = json.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << json << std::string(16, '\0');
  };
  write_header("json.safetensors", "{not json");
  test::expect_error<DataError>([&] { SafetensorsFile(dir.file("json.safetensors")); }, {"not valid JSON"});
  write_header("dtype.safetensors", R"({"t": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})");
  test::expect_error<DataError>([&] { SafetensorsFile(dir.file("dtype.safetensors")); }, {"'t'", "F8_E4M3"});
  write_header("shape.safetensors", R"({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})");
  test::expect_error<DataError>([&] { SafetensorsFile(dir.file("shape.safetensors")); }, {"'t'", "12 bytes"});
  // A shape whose bytes overflow 64 bits (it once wrapped and passed the size check).
  write_header("wrap.safetensors",
               R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296, 4], "data_offsets": [0, 0]}})");
  test::expect_error<DataError>([&] { SafetensorsFile(dir.file("wrap.safetensors")); }, {"'t'", "64 bits"});
  // Overlapping tensors, and a hole (the reference implementation refuses both).
  write_header("overlap.safetensors", R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                          "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})");
  test::expect_error<DataError>([&] { SafetensorsFile(dir.file("overlap.safetensors")); },
                                {"overlap.safetensors", "'b'", "overlaps tensor 'a'"});
  write_header("hole.safetensors", R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                       "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})");
  test::expect_error<DataError>([&] { SafetensorsFile(dir.file("hole.safetensors")); }, {"hole of 4 bytes", "'b'"});
  // Found by tests/fuzz/fuzz_safetensors: a float shape was cast to int64 (undefined beyond its range).
  write_header("float.safetensors", R"({"t": {"dtype": "F32", "shape": [2.4e27], "data_offsets": [0, 4]}})");
  test::expect_error<DataError>([&] { SafetensorsFile(dir.file("float.safetensors")); },
                                {"'t'", "expected an integer, got number 2.4e+27"});
  write_header("offset.safetensors", R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})");
  test::expect_error<DataError>([&] { SafetensorsFile(dir.file("offset.safetensors")); }, {"'t'", "0 <= begin"});
  write_header("field.safetensors", R"({"t": {"dtype": "F32", "data_offsets": [0, 8]}})");
  test::expect_error<DataError>([&] { SafetensorsFile(dir.file("field.safetensors")); }, {"'t'", "malformed"});
  {
    std::ofstream out(dir.file("huge.safetensors"), std::ios::binary);
    const std::uint64_t n = 1ULL << 40;
    out.write(reinterpret_cast<const char*>(&n), 8);
  }
  test::expect_error<DataError>([&] { SafetensorsFile(dir.file("huge.safetensors")); }, {"header length"});
  test::expect_error<DataError>([&] { SafetensorsCheckpoint(dir.path()); }, {"model.safetensors"});
}

TEST(LlamaConfig, PresetsHaveThePublishedParameterCounts) {
  EXPECT_EQ(LlamaConfig::preset("llama3-8b").num_parameters(), 8030261248);    // Meta-Llama-3-8B
  EXPECT_EQ(LlamaConfig::preset("llama3.2-1b").num_parameters(), 1235814400);  // Llama-3.2-1B
  EXPECT_EQ(LlamaConfig::preset("llama3.2-3b").num_parameters(), 3212749824);  // Llama-3.2-3B
  for (const char* name : {"llama3-70b", "llama3.1-70b", "llama3.3-70b"}) {
    EXPECT_EQ(LlamaConfig::preset(name).num_parameters(), 70553706496) << name;  // Meta-Llama-3-70B's count
  }
  test::expect_error<ConfigError>([] { LlamaConfig::preset("gpt2"); }, {"'gpt2'", "llama3-8b"});
}

TEST(LlamaConfig, ConfigJsonRoundTripsEveryPreset) {
  // What a full fine-tuning run writes next to its weights reads back as the same model
  // (transformers reading it: tests/python/test_quant.py).
  test::TempDir dir;
  for (const char* name : {"llama3-8b", "llama3.1-8b", "llama3.2-1b", "tiny"}) {
    const LlamaConfig c = LlamaConfig::preset(name);
    { std::ofstream(dir.file("config.json")) << c.to_hf_json(torch::kBFloat16); }
    const LlamaConfig back = LlamaConfig::from_hf_json(dir.file("config.json"));
    EXPECT_EQ(back.to_hf_json(torch::kBFloat16), c.to_hf_json(torch::kBFloat16)) << name;
    EXPECT_EQ(back.num_parameters(), c.num_parameters()) << name;
    EXPECT_EQ(back.tie_word_embeddings, c.tie_word_embeddings) << name;
    EXPECT_EQ(back.rope_scaling.has_value(), c.rope_scaling.has_value()) << name;
    if (c.rope_scaling) {
      EXPECT_EQ(back.rope_scaling->factor, c.rope_scaling->factor) << name;
    }
    EXPECT_EQ(back.head_dim, c.head_dim) << name;
    EXPECT_EQ(back.rms_norm_eps, c.rms_norm_eps) << name;
    EXPECT_EQ(back.rope_theta, c.rope_theta) << name;
  }
  EXPECT_NE(LlamaConfig::preset("tiny").to_hf_json(torch::kFloat32).find("\"torch_dtype\": \"float32\""),
            std::string::npos);
}

TEST(LlamaConfig, ConfigJsonErrorsNameFileAndField) {
  test::TempDir dir;
  { std::ofstream(dir.file("c.json")) << R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8})"; }
  test::expect_error<DataError>([&] { LlamaConfig::from_hf_json(dir.file("c.json")); },
                                {"c.json", "\"intermediate_size\""});
  {
    std::ofstream(dir.file("r.json")) << R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
      "num_hidden_layers": 1, "num_attention_heads": 2, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})";
  }
  test::expect_error<DataError>([&] { LlamaConfig::from_hf_json(dir.file("r.json")); }, {"r.json", "yarn"});
  {
    std::ofstream(dir.file("h.json")) << R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
      "num_hidden_layers": 1, "num_attention_heads": 3, "num_key_value_heads": 2, "head_dim": 4})";
  }
  test::expect_error<DataError>([&] { LlamaConfig::from_hf_json(dir.file("h.json")); }, {"h.json", "multiple"});
  // Another model's config (an activation other than SiLU, projections with biases): refused, not
  // read as a Llama that would leave the checkpoint's biases out. Llama 3's own values pass.
  const std::string base = R"("vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
      "num_attention_heads": 2)";
  for (const auto& [extra, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"("hidden_act": "gelu")", "hidden_act \"gelu\", expected \"silu\""},
           {R"("attention_bias": true)", "attention_bias true, expected false"},
           {R"("mlp_bias": true)", "mlp_bias true, expected false"},
           // No position trained at: named (was refused later as --pad-to-multiple padding past a context of 0).
           {R"("max_position_embeddings": 0)", "max_position_embeddings 0 must be > 0"},
           // Llama 3.1's RoPE scaling with values llama_inv_freq divides by (it gave NaN frequencies).
           {R"("rope_scaling": {"rope_type": "llama3", "factor": 0.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})",
            "factor 0, low_freq_factor 1, high_freq_factor 4"},
           {R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})",
            "0 < low_freq_factor < high_freq_factor"}}) {
    SCOPED_TRACE(extra);
    { std::ofstream(dir.file("o.json")) << "{" << base << ", " << extra << "}"; }
    test::expect_error<DataError>([&] { LlamaConfig::from_hf_json(dir.file("o.json")); }, {"o.json", needle});
  }
  {
    std::ofstream(dir.file("l.json")) << "{" << base
                                      << R"(, "hidden_act": "silu", "attention_bias": false, "mlp_bias": false})";
  }
  EXPECT_EQ(LlamaConfig::from_hf_json(dir.file("l.json")).hidden_size, 8);
}

TEST(Llama, LogitsEqualTransformers) {
  const std::string root = test::oracle_dir();
  const std::string io_path = root + "/llama_tiny_io.pt";
  MGBENCH_REQUIRE_INPUTS(io_path);
  const auto io = read_torch_state_dict(io_path);
  for (const std::string tag : {"llama_tiny", "llama_tiny_tied", "llama_tiny_sharded"}) {
    SCOPED_TRACE(tag);
    const LlamaConfig config = LlamaConfig::from_hf_json(root + "/" + tag + "/config.json");
    EXPECT_EQ(config.tie_word_embeddings, tag == "llama_tiny_tied");
    ASSERT_TRUE(config.rope_scaling.has_value());
    LlamaForCausalLM model(config);
    model->load_hf_checkpoint(root + "/" + tag);
    model->eval();
    torch::NoGradGuard no_grad;
    const torch::Tensor logits = model->forward(io.at(tag + ".ids"));
    const torch::Tensor expected = io.at(tag + ".logits");
    ASSERT_EQ(logits.sizes(), expected.sizes());
    // fp32; SDPA here vs eager attention there: differences are rounding only.
    EXPECT_LT((logits - expected).abs().max().item<double>(), 1e-4);
  }
}

TEST(Llama, BuildsOnTheDeviceOneUnitAtATime) {
  // Issue 32 item 5: the host holds one unit (embedding, a decoder layer, the head) at a time, never
  // the model. On the CPU the device is the host: a unit placed there gives its storage back here
  // (as a GPU run's would leave the host), and the peak is what the host held before placing.
  const LlamaConfig c = test::eight_layer_llama();
  auto probe = std::make_shared<test::HostTensorBytes>();
  std::vector<std::string> placed;
  std::int64_t whole = 0, layer = 0;
  const auto leave_the_host = [&](const std::string& name, torch::nn::Module& part) {
    placed.push_back(name);
    for (auto& p : part.parameters()) {
      EXPECT_GT(p.max().item<double>(), 0.0) << name << ": placed before it was drawn";  // norms: ones
      whole += p.numel() * 4;
      if (name == "model.layers.0") layer += p.numel() * 4;
      p.storage().set_data_ptr_noswap(at::DataPtr(nullptr, p.device()));  // freed, as FSDP frees a unit
      p.storage().set_nbytes(0);
    }
  };
  {
    const c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, probe);
    LlamaForCausalLM model(c, BaseWeights::kDense, torch::kCPU, leave_the_host);
  }
  const std::vector<std::string> order = {"model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2",
                                          "model.layers.3",     "model.layers.4", "model.layers.5", "model.layers.6",
                                          "model.layers.7",     "model.norm",     "lm_head"};
  EXPECT_EQ(placed, order);
  const std::int64_t embedding = c.vocab_size * c.hidden_size * 4;
  ASSERT_GT(whole, 8 * layer);
  EXPECT_LE(probe->peak, std::max(layer, embedding) + (std::int64_t{1} << 16)) << "of a model of " << whole << " B";
}

TEST(Llama, CheckpointMismatchesAreNamed) {
  const std::string dir = test::oracle_dir() + "/llama_tiny";
  MGBENCH_REQUIRE_INPUTS(dir);
  LlamaConfig wrong = LlamaConfig::from_hf_json(dir + "/config.json");
  wrong.intermediate_size = 96;
  LlamaForCausalLM model(wrong);
  test::expect_error<DataError>([&] { model->load_hf_checkpoint(dir); },
                                {"mlp.gate_proj.weight", "[128, 64]", "[96, 64]"});
  LlamaConfig fewer = LlamaConfig::from_hf_json(dir + "/config.json");
  fewer.num_hidden_layers = 1;
  LlamaForCausalLM small(fewer);
  test::expect_error<DataError>([&] { small->load_hf_checkpoint(dir); }, {"model.layers.1", "not part of the model"});
  // A NaN in a base weight (dense and NF4-loaded paths) is refused, named, at load.
  test::TempDir bad;
  std::filesystem::copy_file(dir + "/config.json", bad.file("config.json"));
  const SafetensorsCheckpoint checkpoint(dir);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& name : checkpoint.names()) {
    torch::Tensor t = checkpoint.tensor(name).clone();
    if (name == "model.layers.1.self_attn.v_proj.weight") t.view({-1})[5] = std::numeric_limits<float>::quiet_NaN();
    tensors.emplace_back(name, t);
  }
  write_safetensors(bad.file("model.safetensors"), tensors);
  LlamaForCausalLM fresh(LlamaConfig::from_hf_json(dir + "/config.json"));
  test::expect_error<DataError>([&] { fresh->load_hf_checkpoint(bad.path()); },
                                {"model.layers.1.self_attn.v_proj.weight", "1 non-finite", "flat index 5"});
  // An integer tensor of the right shape is no weight (it loaded as one, converted): refused, named.
  for (auto& [name, t] : tensors) {
    if (name == "model.layers.1.self_attn.v_proj.weight") t = checkpoint.tensor(name).to(torch::kInt8);
  }
  write_safetensors(bad.file("model.safetensors"), tensors);
  LlamaForCausalLM again(LlamaConfig::from_hf_json(dir + "/config.json"));
  test::expect_error<DataError>([&] { again->load_hf_checkpoint(bad.path()); },
                                {"model.layers.1.self_attn.v_proj.weight", "Char", "expected a float dtype"});
}

TEST(Lora, GradientsEqualPeft) {
  const std::string root = test::oracle_dir();
  const std::string grads_path = root + "/llama_tiny_lora_grads.pt";
  MGBENCH_REQUIRE_INPUTS(grads_path);
  const auto oracle = read_torch_state_dict(grads_path);
  const auto io = read_torch_state_dict(root + "/llama_tiny_io.pt");
  LlamaForCausalLM model(LlamaConfig::from_hf_json(root + "/llama_tiny/config.json"));
  model->load_hf_checkpoint(root + "/llama_tiny");
  LoraOptions options;
  options.rank = 4;
  options.alpha = 8;
  const auto trainable = model->apply_lora(options);
  EXPECT_EQ(trainable.size(), 2u * 6u * 2u);                                      // A and B, 6 projections, 2 layers
  model->load_lora_adapter(root + "/llama_tiny_lora/adapter_model.safetensors");  // PEFT's names and layout
  std::int64_t frozen = 0;
  for (const auto& p : model->parameters()) frozen += p.requires_grad() ? 0 : 1;
  EXPECT_EQ(frozen, static_cast<std::int64_t>(model->parameters().size() - trainable.size()));

  const torch::Tensor ids = io.at("llama_tiny.ids");
  const torch::Tensor logits = model->forward(ids);
  EXPECT_LT((logits - oracle.at("logits")).abs().max().item<double>(), 1e-4);
  const auto v = logits.size(-1);
  const torch::Tensor loss = torch::nn::functional::cross_entropy(logits.narrow(1, 0, ids.size(1) - 1).reshape({-1, v}),
                                                                  ids.narrow(1, 1, ids.size(1) - 1).reshape({-1}));
  EXPECT_NEAR(loss.item<double>(), oracle.at("loss").item<double>(), 1e-5);
  loss.backward();
  int compared = 0;
  for (const auto& [name, tensor] : model->lora_state_dict()) {
    const torch::Tensor& expected = oracle.at("grad." + name);
    ASSERT_TRUE(tensor.grad().defined()) << name;
    // Relative to the gradient's scale: fp32 rounding through two layers.
    const double scale = expected.abs().max().item<double>();
    EXPECT_LT((tensor.grad() - expected).abs().max().item<double>(), 1e-4 * scale + 1e-8) << name;
    ++compared;
  }
  EXPECT_EQ(compared, 24);
  for (const auto& p : model->named_parameters()) {
    if (p.key().find("lora_") == std::string::npos) {
      EXPECT_FALSE(p.value().grad().defined()) << p.key();
    }
  }
}

TEST(Llama, ActivationCheckpointingKeepsTheGradients) {
  for (const double dropout : {0.0, 0.3}) {
    SCOPED_TRACE(dropout);
    auto make = [&] {
      torch::manual_seed(5);
      LlamaConfig c = LlamaConfig::preset("tiny");
      c.vocab_size = 300;
      LlamaForCausalLM m(c);
      LoraOptions o;
      o.dropout = dropout;
      m->apply_lora(o);
      torch::NoGradGuard no_grad;
      for (auto& [_, t] : m->lora_state_dict()) t.normal_(0, 0.1);
      return m;
    };
    LlamaForCausalLM plain = make();
    LlamaForCausalLM checkpointed = make();
    checkpointed->set_activation_checkpointing(true);
    const torch::Tensor ids = torch::randint(0, 300, {2, 24});
    torch::manual_seed(77);  // same dropout masks in both
    plain->forward(ids).pow(2).mean().backward();
    torch::manual_seed(77);
    checkpointed->forward(ids).pow(2).mean().backward();
    const auto a = plain->lora_state_dict();
    const auto b = checkpointed->lora_state_dict();
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(b[i].second.grad().defined()) << a[i].first;
      EXPECT_LT((a[i].second.grad() - b[i].second.grad()).abs().max().item<double>(), 1e-7) << a[i].first;
    }
  }
}

// With activation checkpointing, forward keeps each decoder layer's input and nothing else of it
// for backward: the host bytes held when forward returns grow by [B, T, hidden] a layer, plus, with
// LoRA dropout only, the 5 KB CPU generator state the checkpoint saves for dropout's masks (without
// dropout the generator is not read: a CUDA graph's capture cannot read it); backward recomputes one
// layer at a time, so its peak above that does not grow with the layers (LoRA, whose adapters are
// the only trained tensors, at 2 and 6 layers; torch tensors counted through c10's CPU allocator). A
// run's resident memory grows ~1.6 MiB a layer more than this (1024 hidden, 128 tokens): the
// host allocator's, not tensors held.
TEST(Llama, ActivationCheckpointingKeepsOneHiddenStateALayer) {
  const std::int64_t b = 2, t = 64;
  LlamaConfig c = test::eight_layer_llama();
  const std::int64_t hidden_state = b * t * c.hidden_size * 4;
  const auto rng_state = static_cast<std::int64_t>(at::detail::getDefaultCPUGenerator().get_state().nbytes());
  for (const double dropout : {0.0, 0.1}) {
    SCOPED_TRACE(dropout);
    const std::int64_t layers[2] = {2, 6};
    std::int64_t held[2] = {0, 0};
    std::int64_t backward_peak[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      c.num_hidden_layers = layers[k];
      torch::manual_seed(3);
      LlamaForCausalLM m(c);
      LoraOptions lora;
      lora.dropout = dropout;
      m->apply_lora(lora);
      m->set_activation_checkpointing(true);
      m->train();
      const torch::Tensor ids = torch::randint(0, c.vocab_size, {b, t});
      auto probe = std::make_shared<test::HostTensorBytes>();
      const c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, probe);
      const torch::Tensor loss = m->forward(ids).pow(2).mean();
      held[k] = probe->current;
      probe->peak = probe->current;
      loss.backward();
      backward_peak[k] = probe->peak - held[k];
    }
    EXPECT_EQ((held[1] - held[0]) / (layers[1] - layers[0]), hidden_state + (dropout > 0 ? rng_state : 0))
        << "held after forward: " << held[0] << " and " << held[1] << " bytes";
    // With dropout, each layer's saved generator state lives until its node is released in backward.
    const std::int64_t states = dropout > 0 ? (layers[1] - layers[0]) * rng_state : 0;
    EXPECT_LE(backward_peak[1], backward_peak[0] + hidden_state + states)
        << "backward's peak above forward: " << backward_peak[0] << " and " << backward_peak[1] << " bytes";
  }
}

// The CPU's chunked causal attention against scaled_dot_product_attention(is_causal=True): forward
// and the gradients of q, k and v, fp64 / fp32 / bf16, with and without grouped-query attention, at
// lengths around the chunk edges (one call below 512; four chunks of ceil(T / 4) from 512).
TEST(Llama, ChunkedCausalAttentionEqualsSdpa) {
  for (const auto dtype : {torch::kFloat64, torch::kFloat32, torch::kBFloat16}) {
    const double tol = dtype == torch::kFloat64 ? 1e-12 : dtype == torch::kFloat32 ? 2e-5 : 3e-2;
    for (const std::int64_t kv_heads : {4, 2}) {
      for (const std::int64_t t : {1, 65, 511, 512, 513, 1030}) {
        SCOPED_TRACE(::testing::Message() << c10::toString(dtype) << " kv_heads " << kv_heads << " T " << t);
        torch::manual_seed(t);
        const auto options = torch::TensorOptions().dtype(dtype);
        const torch::Tensor q0 = torch::randn({2, 4, t, 16}, options), k0 = torch::randn({2, kv_heads, t, 16}, options),
                            v0 = torch::randn({2, kv_heads, t, 16}, options), g = torch::randn({2, 4, t, 16}, options);
        auto run = [&](bool ours) {
          const torch::Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
                              v = v0.clone().requires_grad_();
          const torch::Tensor out =
              ours ? causal_attention(q, k, v)
                   : at::scaled_dot_product_attention(q, k, v, {}, 0.0, true, std::nullopt, kv_heads != 4);
          out.backward(g);
          return std::vector<torch::Tensor>{out.detach(), q.grad(), k.grad(), v.grad()};
        };
        const auto ours = run(true), reference = run(false);
        const char* names[] = {"output", "dq", "dk", "dv"};
        for (std::size_t i = 0; i < ours.size(); ++i) {
          const double scale = 1 + reference[i].abs().max().item<double>();
          EXPECT_LT((ours[i] - reference[i]).abs().max().item<double>(), tol * scale) << names[i];
        }
      }
    }
  }
}

// Packed sequences on the CPU, long ones chunked: one node gives each sequence what SDPA gives it
// alone, forward and backward (float64, GQA).
TEST(Llama, PackedCausalAttentionEqualsSdpaPerSequence) {
  const std::vector<std::int64_t> lengths{600, 3, 530, 1};
  const std::int64_t total = 1134;
  torch::manual_seed(9);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  const torch::Tensor q0 = torch::randn({1, 4, total, 8}, f64), k0 = torch::randn({1, 2, total, 8}, f64),
                      v0 = torch::randn({1, 2, total, 8}, f64), g = torch::randn({1, 4, total, 8}, f64);
  auto run = [&](bool ours) {
    const torch::Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
                        v = v0.clone().requires_grad_();
    torch::Tensor out;
    if (ours) {
      const PackedRuns runs = PackedRuns::of(lengths);
      out = causal_attention(q, k, v, &runs);
    } else {
      std::vector<torch::Tensor> parts;
      std::int64_t start = 0;
      for (const std::int64_t n : lengths) {
        parts.push_back(at::scaled_dot_product_attention(q.narrow(2, start, n), k.narrow(2, start, n),
                                                         v.narrow(2, start, n), {}, 0.0, true, std::nullopt, true));
        start += n;
      }
      out = torch::cat(parts, 2);
    }
    out.backward(g);
    return std::vector<torch::Tensor>{out.detach(), q.grad(), k.grad(), v.grad()};
  };
  const auto ours = run(true), reference = run(false);
  for (std::size_t i = 0; i < ours.size(); ++i) {
    EXPECT_LT((ours[i] - reference[i]).abs().max().item<double>(), 1e-12) << i;
  }
  const PackedRuns short_runs = PackedRuns::of({600, 3});
  test::expect_error<std::invalid_argument>([&] { causal_attention(q0, k0, v0, &short_runs); }, {"603", "1134"});
}

// --padding none: sequences packed into one row (positions restarting, attention within each)
// give each sequence the hidden states and LoRA gradients it has right-padded in a batch -- fp64,
// grouped-query attention, lengths 1 to 17, with and without activation checkpointing.
TEST(Llama, PackedSequencesEqualTheirPaddedRows) {
  const std::vector<std::int64_t> lengths{5, 17, 1, 11};
  const std::int64_t rows = 4, longest = 17, total = 34;
  torch::manual_seed(3);
  const torch::Tensor padded = torch::randint(0, 300, {rows, longest});
  std::vector<torch::Tensor> pieces, positions;
  for (std::int64_t r = 0; r < rows; ++r) {
    pieces.push_back(padded[r].narrow(0, 0, lengths[static_cast<std::size_t>(r)]));
    positions.push_back(torch::arange(lengths[static_cast<std::size_t>(r)]));
  }
  const torch::Tensor packed = torch::cat(pieces).unsqueeze(0);
  const SequencePacking packing{torch::cat(positions), PackedRuns::of(lengths)};
  for (const bool checkpointing : {false, true}) {
    SCOPED_TRACE(checkpointing);
    auto make = [] {
      torch::manual_seed(5);
      LlamaConfig c = LlamaConfig::preset("tiny");
      c.vocab_size = 300;
      LlamaForCausalLM m(c);
      m->to(torch::kFloat64);
      m->apply_lora(LoraOptions{});
      torch::NoGradGuard no_grad;
      for (auto& [_, t] : m->lora_state_dict()) t.normal_(0, 0.1);
      return m;
    };
    LlamaForCausalLM a = make(), b = make();
    a->set_activation_checkpointing(checkpointing);
    b->set_activation_checkpointing(checkpointing);
    const torch::Tensor h_padded = a->hidden_states(padded);            // [4, 17, 64]
    const torch::Tensor h_packed = b->hidden_states(packed, &packing);  // [1, 34, 64]
    ASSERT_EQ(h_packed.sizes(), (std::vector<std::int64_t>{1, total, 64}));
    std::vector<torch::Tensor> real;
    for (std::int64_t r = 0; r < rows; ++r)
      real.push_back(h_padded[r].narrow(0, 0, lengths[static_cast<std::size_t>(r)]));
    const torch::Tensor expected = torch::cat(real);
    EXPECT_LT((h_packed[0] - expected).abs().max().item<double>(), 1e-12);
    // A loss of the real positions only: the same adapter gradients.
    const torch::Tensor weights = torch::rand({total, 64}, torch::kFloat64);
    (expected * weights).sum().backward();
    (h_packed[0] * weights).sum().backward();
    const auto ga = a->lora_state_dict(), gb = b->lora_state_dict();
    for (std::size_t i = 0; i < ga.size(); ++i) {
      EXPECT_LT((ga[i].second.grad() - gb[i].second.grad()).abs().max().item<double>(), 1e-12) << ga[i].first;
    }
  }
  // Packing that does not describe the tokens is refused, saying what it needs.
  LlamaForCausalLM m(LlamaConfig::preset("tiny"));
  const SequencePacking short_by_one{torch::arange(total - 1), PackedRuns::of({5, 17, 1, 10})};
  test::expect_error<std::invalid_argument>([&] { m->hidden_states(packed, &short_by_one); }, {"[1, S]", "33"});
}

TEST(Lora, AdapterRoundTripsInPeftFormat) {
  LlamaForCausalLM model(LlamaConfig::preset("tiny"));
  model->apply_lora(LoraOptions{});
  {
    torch::NoGradGuard no_grad;
    for (auto& [_, t] : model->lora_state_dict()) t.normal_();
  }
  test::TempDir dir;
  write_safetensors(dir.file("adapter_model.safetensors"), model->lora_state_dict());
  LlamaForCausalLM other(LlamaConfig::preset("tiny"));
  other->apply_lora(LoraOptions{});
  other->load_lora_adapter(dir.file("adapter_model.safetensors"));
  const auto a = model->lora_state_dict();
  const auto b = other->lora_state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first.rfind("base_model.model.model.layers.", 0), 0u) << a[i].first;
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
  }
  LoraOptions fewer;
  fewer.targets = {"q_proj"};
  LlamaForCausalLM third(LlamaConfig::preset("tiny"));
  third->apply_lora(fewer);
  test::expect_error<DataError>([&] { third->load_lora_adapter(dir.file("adapter_model.safetensors")); },
                                {"adapter_model.safetensors", "not an adapter of this model"});
  // A NaN, or an integer tensor, in an adapter evaluated to `eval loss: nan` or a wrong loss: refused.
  for (const bool integer : {false, true}) {
    auto tensors = model->lora_state_dict();
    const std::string name = tensors[1].first;
    torch::Tensor changed = tensors[1].second.detach().clone();
    if (integer) {
      changed = changed.to(torch::kInt8);
    } else {
      changed.view({-1})[3] = std::numeric_limits<float>::quiet_NaN();
    }
    tensors[1].second = changed;
    write_safetensors(dir.file("bad.safetensors"), tensors);
    test::expect_error<DataError>([&] { other->load_lora_adapter(dir.file("bad.safetensors")); },
                                  {"bad.safetensors", name, integer ? "expected a float dtype" : "1 non-finite"});
  }
  LoraOptions bad;
  bad.targets = {"wq"};
  test::expect_error<ConfigError>([&] { third->apply_lora(bad); }, {"--lora-targets", "'wq'"});
}

}  // namespace
}  // namespace mgbench::models
