// `hearth init-model`: writes a randomly initialized llama-family model folder (config.json,
// model.safetensors, tokenizer files with a chat template, generation_config.json) from a config
// file and a tokenizer folder, ready for `hearth train --fine-tune-type full`. Initialization
// follows transformers' LlamaPreTrainedModel._init_weights. Not a trainer and not a converter.
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <iostream>

#include "cli/number_option.h"
#include "cli/output_folder.h"
#include "cli/verb.h"
#include "core/error.h"
#include "io/atomic_dir.h"
#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "models/llama/config.h"
#include "models/registry.h"
#include "tokenizer/tokenizer.h"

namespace {
namespace fs = std::filesystem;
using namespace hearth;
using nlohmann::json;

/// The chat template written when the tokenizer folder has none (Llama-2's tokenizer ships none).
/// Llama-2-chat style, single BOS: "<s>[INST] user [/INST] assistant</s>". The template writes the
/// BOS itself, so `hearth train` (which encodes the render without special tokens) and the engine
/// (which drops the post-processor's doubled BOS) see the same ids. The generation prompt adds
/// nothing: the assistant's text starts with a space after "[/INST]", so a prompt tokenizes as a
/// prefix of prompt + completion. Each assistant turn ends with the EOS token, which is also the
/// generation config's eos_token_id, so a fine-tuned model learns to stop.
constexpr const char* kDefaultChatTemplate =
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '<<SYS>>\\n' + message['content'] + '\\n<</SYS>>\\n\\n' }}"
    "{% elif message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('only system, user and assistant roles are supported') }}"
    "{% endif %}{% endfor %}";

struct InitOptions {
  std::string config, tokenizer, out, dtype = "float32", chat_template;
  uint64_t seed = 0;
};

at::ScalarType parse_dtype(const std::string& s) {
  if (s == "float32" || s == "f32" || s == "fp32") return at::kFloat;
  if (s == "bfloat16" || s == "bf16") return at::kBFloat16;
  if (s == "float16" || s == "f16" || s == "fp16") return at::kHalf;
  throw InvalidArgument(cat("--dtype: '", s, "' unsupported (expected float32, bfloat16 or float16)"));
}

const char* dtype_config_name(at::ScalarType t) {
  return t == at::kBFloat16 ? "bfloat16" : t == at::kHalf ? "float16" : "float32";
}

const char* architecture_of(const std::string& model_type) {
  if (model_type == "mistral") return "MistralForCausalLM";
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  if (model_type == "qwen3") return "Qwen3ForCausalLM";
  return "LlamaForCausalLM";
}

/// Every tensor of a llama-family checkpoint for `c`, Hugging Face names, fp32 on CPU, drawn in
/// model order (embedding, layers 0..L-1, final norm, lm_head) from one generator seeded `seed`:
/// Linear and Embedding weights ~ normal(0, std), biases 0, RMSNorm weights 1 (transformers'
/// _init_weights; the draw order differs from torch's module order, so values are not
/// bit-identical to a transformers init with the same seed, only identically distributed).
/// The embedding row of `pad_id` (when given) is zeroed, as nn.Embedding's padding_idx is.
/// Tied embeddings: no lm_head tensor.
std::map<std::string, at::Tensor> init_tensors(const models::llama::LlamaConfig& c, double std, uint64_t seed,
                                               std::optional<int64_t> pad_id) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  std::map<std::string, at::Tensor> t;
  auto normal = [&](const std::string& name, std::vector<int64_t> shape) {
    t[name] = at::empty(shape, at::kFloat).normal_(0.0, std, gen);
  };
  auto linear = [&](const std::string& path, int64_t in, int64_t out, bool bias) {
    normal(path + ".weight", {out, in});
    if (bias) t[path + ".bias"] = at::zeros({out}, at::kFloat);
  };
  auto norm = [&](const std::string& path, int64_t n) { t[path + ".weight"] = at::ones({n}, at::kFloat); };
  const int64_t C = c.hidden_size, H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim,
                I = c.intermediate_size, V = c.vocab_size;
  normal("model.embed_tokens.weight", {V, C});
  if (pad_id && *pad_id >= 0 && *pad_id < V) t["model.embed_tokens.weight"][*pad_id].zero_();
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = cat("model.layers.", i, ".");
    norm(p + "input_layernorm", C);
    linear(p + "self_attn.q_proj", C, H * D, c.qkv_bias);
    linear(p + "self_attn.k_proj", C, Hkv * D, c.qkv_bias);
    linear(p + "self_attn.v_proj", C, Hkv * D, c.qkv_bias);
    linear(p + "self_attn.o_proj", H * D, C, c.o_bias);
    if (c.qk_norm) {
      norm(p + "self_attn.q_norm", D);
      norm(p + "self_attn.k_norm", D);
    }
    norm(p + "post_attention_layernorm", C);
    linear(p + "mlp.gate_proj", C, I, c.mlp_bias);
    linear(p + "mlp.up_proj", C, I, c.mlp_bias);
    linear(p + "mlp.down_proj", I, C, c.mlp_bias);
  }
  norm("model.norm", C);
  if (!c.tie_word_embeddings) linear("lm_head", C, V, false);
  return t;
}

void init_into(const InitOptions& o, const fs::path& tmp) {
  const fs::path cfg_path(o.config), tok_dir(o.tokenizer);
  json config = io::read_json(cfg_path);
  HEARTH_CHECK_T(InvalidArgument, config.is_object(), cfg_path.string(), ": not a JSON object");
  const auto parsed = models::llama::LlamaConfig::from_json(config, cfg_path.string());
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_dir(tok_dir);
  HEARTH_CHECK_T(InvalidArgument, parsed.vocab_size == tok.vocab_size(), cfg_path.string(), ": vocab_size ",
                 parsed.vocab_size, " does not match the tokenizer's ", tok.vocab_size(), " (",
                 (tok_dir / "tokenizer.json").string(), ")");
  double std = 0.02;
  if (auto it = config.find("initializer_range"); it != config.end()) {
    HEARTH_CHECK_T(InvalidArgument, it->is_number() && it->get<double>() > 0 && it->get<double>() < 1,
                   cfg_path.string(), ": initializer_range must be a number in (0, 1), got ", it->dump());
    std = it->get<double>();
  }
  std::optional<int64_t> pad_id;
  if (auto it = config.find("pad_token_id"); it != config.end() && it->is_number_integer()) pad_id = it->get<int64_t>();
  const at::ScalarType dtype = parse_dtype(o.dtype);
  // The weights are made in float32 first: refuse what this machine cannot hold before trying
  // (libtorch's allocator error names no file or field).
  const double C = static_cast<double>(parsed.hidden_size), I = static_cast<double>(parsed.intermediate_size),
               V = static_cast<double>(parsed.vocab_size), HD = static_cast<double>(parsed.num_attention_heads * parsed.head_dim),
               KD = static_cast<double>(parsed.num_key_value_heads * parsed.head_dim);
  const double n_params = V * C * (parsed.tie_word_embeddings ? 1 : 2) +
                        static_cast<double>(parsed.num_hidden_layers) * (2 * C * HD + 2 * C * KD + 3 * C * I);
  const double need = n_params * 4, have = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  HEARTH_CHECK_T(InvalidArgument, have <= 0 || need < have, cfg_path.string(), ": the model has ", n_params / 1e9,
                 " billion parameters, ", need / 1e9, " GB in float32 while initializing; this machine has ", have / 1e9,
                 " GB of memory");

  // Weights.
  std::map<std::string, at::Tensor> tensors = init_tensors(parsed, std, o.seed, pad_id);
  for (auto& [_, t] : tensors) t = t.to(dtype);
  io::save_safetensors(tmp / "model.safetensors", tensors, {{"format", "pt"}});

  // config.json: the given config plus what the folder's files imply.
  config["torch_dtype"] = dtype_config_name(dtype);
  if (config.contains("dtype")) config["dtype"] = dtype_config_name(dtype);
  config["model_type"] = parsed.model_type;
  if (!config.contains("architectures")) config["architectures"] = json::array({architecture_of(parsed.model_type)});
  if (!config.contains("initializer_range")) config["initializer_range"] = std;
  const auto bos = tok.bos_id(), eos = tok.eos_id();
  if (bos && !config.contains("bos_token_id")) config["bos_token_id"] = *bos;
  if (eos && !config.contains("eos_token_id")) config["eos_token_id"] = *eos;
  io::write_file_atomic(tmp / "config.json", config.dump(2) + "\n");

  // Tokenizer files, with a chat template when the tokenizer has none.
  std::error_code ec;
  for (const char* name : {"tokenizer.json", "special_tokens_map.json", "tokenizer.model", "chat_template.jinja"}) {
    if (!fs::exists(tok_dir / name)) continue;
    fs::copy_file(tok_dir / name, tmp / name, ec);
    HEARTH_CHECK(!ec, (tok_dir / name).string(), ": cannot copy (", ec.message(), ")");
  }
  json tok_config = json::object();
  if (fs::exists(tok_dir / "tokenizer_config.json")) {
    tok_config = io::read_json(tok_dir / "tokenizer_config.json");
    HEARTH_CHECK_T(InvalidArgument, tok_config.is_object(), (tok_dir / "tokenizer_config.json").string(),
                   ": not a JSON object");
  }
  if (!o.chat_template.empty()) {
    tok_config["chat_template"] = io::read_file(o.chat_template, io::FileKind::kText);
    if (fs::exists(tmp / "chat_template.jinja")) fs::remove(tmp / "chat_template.jinja");
  } else if (tok.chat_template().empty()) {
    tok_config["chat_template"] = kDefaultChatTemplate;
  }
  io::write_file_atomic(tmp / "tokenizer_config.json", tok_config.dump(2) + "\n");

  json gen = json::object();
  if (bos) gen["bos_token_id"] = *bos;
  if (eos) gen["eos_token_id"] = *eos;
  io::write_file_atomic(tmp / "generation_config.json", gen.dump(2) + "\n");

  // The folder must load and run before it is moved into place.
  {
    c10::NoGradGuard no_grad;
    auto model = models::load_model(tmp, nn::LoadOptions{at::kCPU, at::kFloat});
    const tokenizer::Tokenizer check = tokenizer::Tokenizer::from_dir(tmp);
    std::vector<int32_t> ids = check.encode("Hello", true);
    at::Tensor input = at::tensor(std::vector<int64_t>(ids.begin(), ids.end()), at::kLong).unsqueeze(0);
    at::Tensor logits = model->forward(input, 0, nullptr);
    HEARTH_CHECK(logits.isfinite().all().item<bool>(), tmp.string(), ": the initialized model's logits are not finite");
  }
  int64_t params = 0;
  for (const auto& [_, t] : tensors) params += t.numel();
  std::cout << "initialized " << parsed.model_type << ": " << params << " parameters (" << tensors.size()
            << " tensors, " << dtype_config_name(dtype) << ", std " << std << ", seed " << o.seed << ")"
            << (parsed.tie_word_embeddings ? ", tied embeddings" : "") << "\n";
}

int run_init(const InitOptions& o) {
  const fs::path out = cli::without_trailing_slash(o.out);
  std::error_code ec;
  HEARTH_CHECK_T(NotFound, fs::is_regular_file(o.config, ec), o.config, ": config file not found");
  HEARTH_CHECK_T(NotFound, fs::is_directory(o.tokenizer, ec), o.tokenizer, ": tokenizer folder not found");
  cli::check_new_output_folder("init-model", out);
  // As convert and fuse: OUT.tmp.PID renamed into place; SIGINT/SIGTERM remove it, and a run killed
  // outright leaves one that the next run removes.
  return cli::write_new_folder("init-model", out, [&] {
    io::write_dir_atomic(out, /*replace=*/false, [&](const fs::path& tmp) {
      init_into(o, tmp);
      cli::check_output_signal();
    });
  });
}

std::function<int()> setup_init(CLI::App& app) {
  auto o = std::make_shared<InitOptions>();
  app.add_option("--config", o->config, "config.json of the new model (llama, mistral, qwen2 or qwen3)")->required();
  app.add_option("--tokenizer", o->tokenizer, "Folder with tokenizer.json (+ tokenizer_config.json)")->required();
  app.add_option("--out,-o", o->out, "Output model folder (must not exist)")->required();
  app.add_option("--seed", o->seed, "Initialization seed (default 0)")->check(hearth::cli::seed_number());
  app.add_option("--dtype", o->dtype, "Stored weight dtype: float32 | bfloat16 | float16 (default float32)");
  app.add_option("--chat-template", o->chat_template,
                 "Jinja file for tokenizer_config.json's chat_template (default: the tokenizer's, else a "
                 "Llama-2-chat style one)");
  return [o] { return run_init(*o); };
}

}  // namespace
HEARTH_REGISTER_VERB(init_model, "init-model", "Write a randomly initialized llama-family model folder", setup_init);
