// ModelEngine on tiny golden models (CPU fp32), directly and through the real HTTP server in
// process: greedy output equals the plain generation loop, prompt building (template, no double
// BOS, tool_call arguments as objects), logprobs against a cache-free forward, errors, and the
// adapter routes (mount/list/unmount, 403/404/400/409, selection per request, a DELETE queued
// behind a running request).
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <fstream>
#include <future>
#include <thread>

#include "../adapters/lora_test_util.h"
#include "../io/io_test_util.h"
#include "chat/chat_template.h"
#include "server/api_error.h"
#include "server/model_engine.h"
#include "server/server.h"
#include "test_paths.h"

namespace hearth::server {
namespace {

namespace fs = std::filesystem;
using J = nlohmann::json;
using hearth::testing::golden_lora;
using hearth::testing::TempDir;
using hearth::testing::golden_model;

// ChatML with the BOS written by the template (the post-processor adds another one) and the
// assistant's tool calls rendered from the *object* arguments.
const char* kEngineTemplate =
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content %}{{ m.content }}{% endif %}"
    "{% if m.tool_calls %}{% for tc in m.tool_calls %}<tool_call>{{ tc.function.name }} city={{ tc.function.arguments.city }}"
    "</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

// A copy of a golden model with a chat template in tokenizer_config.json (and an adapters/ root).
fs::path model_with_template(const fs::path& dir, const std::string& variant, const std::string& tmpl) {
  fs::copy(golden_model(variant), dir, fs::copy_options::recursive);
  J cfg = io::read_json(dir / "tokenizer_config.json");
  if (!tmpl.empty()) cfg["chat_template"] = tmpl;
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump(1);
  fs::create_directories(dir / "adapters");
  return dir;
}

ModelEngineOptions cpu_options(const fs::path& dir) {
  ModelEngineOptions o;
  o.model_dir = dir;
  o.device = "cpu";
  o.dtype = "float32";
  return o;
}

CompletionRequest chat_request(const std::string& user, int64_t max_tokens) {
  CompletionRequest r;
  r.chat = true;
  r.messages.push_back(ChatMessage{"user", user, "", "", {}});
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0;
  return r;
}

// The reference: generate::generate on the given ids, greedy, same EOS ids, decoded at the end.
struct Reference {
  std::vector<int64_t> tokens;
  std::string text;
  bool eos = false;
};
Reference reference_generate(const fs::path& dir, const std::vector<int64_t>& ids, int64_t max_tokens,
                             const std::string& adapter_dir = "") {
  auto tok = tokenizer::Tokenizer::from_dir(dir);
  auto model = models::load_model(dir, {at::kCPU, at::kFloat});
  std::vector<std::string> active;
  if (!adapter_dir.empty()) {
    auto ad = adapters::load_adapter(adapter_dir);
    adapters::mount(*model, ad);
    active.push_back(ad.id);
  }
  nn::ActiveAdapters scope(active);
  generate::GenerateOptions o;
  o.max_tokens = max_tokens;
  o.eos_ids = io::GenerationConfig::load(dir).eos_token_ids;
  if (auto e = tok.eos_id()) o.eos_ids.push_back(*e);
  auto res = generate::generate(*model, ids, o);
  std::vector<int32_t> t32(res.tokens.begin(), res.tokens.end());
  return {res.tokens, tok.decode(t32, true), res.stats.stopped_by_eos};
}

class ModelServerTest : public ::testing::Test {
 protected:
  void start(ModelEngineOptions o) {
    engine_ = std::make_unique<ModelEngine>(std::move(o));
    ServerOptions so;
    so.port = 0;
    server_ = std::make_unique<Server>(*engine_, so);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->serve(); });
  }
  void TearDown() override {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
  }
  httplib::Client client() {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c;
  }
  httplib::Result post(const std::string& path, const J& body) {
    return client().Post(path.c_str(), body.dump(), "application/json");
  }
  J post_ok(const std::string& path, const J& body) {
    auto r = post(path, body);
    EXPECT_TRUE(r);
    if (!r) return J();
    EXPECT_EQ(r->status, 200) << r->body;
    return J::parse(r->body);
  }
  // Concatenated content (or text) of an SSE body.
  static std::string sse_text(const std::string& body, bool chat) {
    std::string out;
    size_t pos = 0;
    while ((pos = body.find("data: ", pos)) != std::string::npos) {
      size_t end = body.find("\n\n", pos);
      std::string ev = body.substr(pos + 6, end - pos - 6);
      pos = end;
      if (ev == "[DONE]") break;
      J j = J::parse(ev);
      if (j.contains("error")) ADD_FAILURE() << ev;
      if (j["choices"].empty()) continue;
      const J& c = j["choices"][0];
      if (chat && c["delta"].contains("content") && c["delta"]["content"].is_string()) out += c["delta"]["content"];
      if (!chat && c["text"].is_string()) out += c["text"];
    }
    return out;
  }

  TempDir tmp_;
  std::unique_ptr<ModelEngine> engine_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
};

TEST_F(ModelServerTest, PromptBuildingRendersTheTemplateWithoutDoubleBos) {
  fs::path dir = model_with_template(tmp_.path() / "m", "llama_mha", kEngineTemplate);
  ModelEngine engine(cpu_options(dir));
  EXPECT_TRUE(engine.has_chat_template());
  EXPECT_EQ(engine.context_length(), 256);  // config.json max_position_embeddings
  CompletionRequest req = chat_request("hi there", 8);
  ChatMessage asst{"assistant", std::nullopt, "", "", {ToolCall{"call_1", "get_weather", R"({"city": "Paris"})"}}};
  req.messages.push_back(asst);
  req.messages.push_back(ChatMessage{"tool", "18 C", "get_weather", "call_1", {}});
  Prompt p = engine.prepare(req);
  // The template's own text, with arguments rendered from the parsed object.
  EXPECT_EQ(p.text,
            "<|bos|><|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n<tool_call>get_weather city=Paris"
            "</tool_call><|im_end|>\n<|im_start|>tool\n18 C<|im_end|>\n<|im_start|>assistant\n");
  const int32_t bos = *engine.tokenizer().bos_id();
  ASSERT_GE(p.ids.size(), 2u);
  EXPECT_EQ(p.ids[0], bos);
  EXPECT_NE(p.ids[1], bos) << "doubled BOS kept";
  // One BOS: exactly the text tokenized without the post-processor.
  std::vector<int32_t> plain = engine.tokenizer().encode(p.text, /*add_special_tokens=*/false);
  EXPECT_EQ(p.ids, std::vector<int64_t>(plain.begin(), plain.end()));
  // Completions keep the post-processor's BOS.
  CompletionRequest comp;
  comp.chat = false;
  comp.prompt = "hello world";
  Prompt pc = engine.prepare(comp);
  std::vector<int32_t> with = engine.tokenizer().encode("hello world", true);
  EXPECT_EQ(pc.ids, std::vector<int64_t>(with.begin(), with.end()));
  EXPECT_EQ(pc.ids[0], bos);
  // Unknown adapter ids are request errors: a 400 naming the field.
  CompletionRequest bad = chat_request("x", 4);
  bad.adapter = "nope";
  for (int on_engine_thread = 0; on_engine_thread < 2; ++on_engine_thread) try {  // prepare(), then the check
      on_engine_thread ? engine.check_request(bad) : (void)engine.prepare(bad);     // that finds an unmount since
      ADD_FAILURE() << "an unknown adapter was accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.param(), "adapter");  // the same fields either way (null on the engine thread before)
      EXPECT_EQ(e.code(), "invalid_value");
      EXPECT_NE(std::string(e.what()).find("unknown adapter \"nope\""), std::string::npos) << e.what();
    }
  bad.adapter = "a++b";  // a malformed selection too
  EXPECT_THROW(engine.prepare(bad), ApiError);
  bad.adapter = "";  // and an empty one (it ran the base model)
  EXPECT_THROW(engine.prepare(bad), ApiError);
  bad.adapter = "none";
  EXPECT_NO_THROW(engine.prepare(bad));
  // A template that refuses the messages is the client's 400 on 'messages'.
  ModelEngine refusing(cpu_options(model_with_template(tmp_.path() / "r", "llama_mha", "{{ raise_exception('no x') }}")));
  try {
    refusing.prepare(chat_request("x", 4));
    ADD_FAILURE() << "rendered";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "messages");
    EXPECT_NE(std::string(e.what()).find("could not render them: "), std::string::npos) << e.what();
  }
}

TEST_F(ModelServerTest, SamplingDefaultsResolveRequestThenServerThenGenerationConfig) {
  fs::path dir = model_with_template(tmp_.path() / "m", "llama_mha", kEngineTemplate);
  J gc = io::read_json(dir / "generation_config.json");
  gc["temperature"] = 0.6;
  gc["top_p"] = 0.9;
  gc["top_k"] = 20;
  std::ofstream(dir / "generation_config.json") << gc.dump();
  ModelEngineOptions o = cpu_options(dir);
  o.defaults.top_k = 5;
  ModelEngine engine(o);
  CompletionRequest req = chat_request("x", 4);
  req.sampling.temperature.reset();
  auto sp = engine.resolve_sampling(req);
  EXPECT_DOUBLE_EQ(sp.temperature, 0.6);  // generation_config
  EXPECT_DOUBLE_EQ(sp.top_p, 0.9);        // generation_config
  EXPECT_EQ(sp.top_k, 5);                 // server default beats generation_config
  req.sampling.top_k = 7;
  req.sampling.presence_penalty = 0.5;
  req.sampling.seed = 42;
  sp = engine.resolve_sampling(req);
  EXPECT_EQ(sp.top_k, 7);  // request beats everything
  EXPECT_DOUBLE_EQ(sp.presence_penalty, 0.5);
  EXPECT_EQ(sp.seed, 42u);
  // Thinking off and no explicit temperature: min(config, 0.7) (here 0.6 stays).
  req.chat_template_kwargs["enable_thinking"] = false;
  EXPECT_DOUBLE_EQ(engine.resolve_sampling(req).temperature, 0.6);
  // Without any config: built-in temperature 0.7, top-p/top-k off; fresh seeds differ.
  fs::path plain = model_with_template(tmp_.path() / "p", "llama_mha", kEngineTemplate);
  ModelEngine e2(cpu_options(plain));
  CompletionRequest bare = chat_request("x", 4);
  bare.sampling.temperature.reset();
  auto d = e2.resolve_sampling(bare);
  EXPECT_DOUBLE_EQ(d.temperature, 0.7);
  EXPECT_DOUBLE_EQ(d.top_p, 0.0);
  EXPECT_EQ(d.top_k, 0);
  EXPECT_DOUBLE_EQ(d.repetition_penalty, 0.0);
  EXPECT_NE(d.seed, e2.resolve_sampling(bare).seed);
}

TEST_F(ModelServerTest, LogitBiasSteersGreedyDecodingAndIdsAreChecked) {
  fs::path dir = model_with_template(tmp_.path() / "m", "llama_mha", kEngineTemplate);
  ModelEngine engine(cpu_options(dir));
  CompletionRequest req = chat_request("x", 3);
  req.sampling.temperature = 0.0;
  const int64_t forced = 300;  // a plain vocabulary id of the tiny tokenizer (not EOS)
  req.sampling.logit_bias = {{forced, 100.0}};
  std::vector<int64_t> got;
  engine.generate(engine.prepare(req), req, [&](const TokenEvent& ev) {
    got.push_back(ev.id);
    return true;
  });
  EXPECT_EQ(got, (std::vector<int64_t>{forced, forced, forced}));
  req.sampling.logit_bias = {{512, 1.0}};  // the tiny vocabulary has 512 ids
  EXPECT_THROW(engine.prepare(req), ApiError);  // before generation: the client gets a 400
  try {
    engine.resolve_sampling(req);
    ADD_FAILURE() << "an id outside the vocabulary was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "logit_bias");
  }
}

TEST_F(ModelServerTest, IgnoreEosGeneratesPastEosToMaxTokens) {
  // logit_bias forces an EOS id first: it ends the request at once, unless ignore_eos (vLLM's flag)
  // lets it run to max_tokens.
  fs::path dir = model_with_template(tmp_.path() / "m", "llama_mha", kEngineTemplate);
  ModelEngine engine(cpu_options(dir));
  ASSERT_FALSE(engine.eos_ids().empty());
  CompletionRequest req = chat_request("x", 4);
  req.sampling.temperature = 0.0;
  req.sampling.logit_bias = {{engine.eos_ids().front(), 100.0}};
  auto run = [&] {
    std::vector<int64_t> got;
    engine.generate(engine.prepare(req), req, [&](const TokenEvent& ev) {
      got.push_back(ev.id);
      return true;
    });
    return got;
  };
  EXPECT_TRUE(run().empty());
  req.ignore_eos = true;
  EXPECT_EQ(run(), std::vector<int64_t>(4, engine.eos_ids().front()));
}

TEST_F(ModelServerTest, GreedyChatThroughHttpEqualsTheGenerationLoop) {
  fs::path dir = model_with_template(tmp_.path() / "m", "llama_mha", kEngineTemplate);
  start(cpu_options(dir));
  const std::string user = "The quick brown fox";
  // Reference ids built independently: render + encode without the post-processor.
  auto tok = tokenizer::Tokenizer::from_dir(dir);
  J msgs = J::array({{{"role", "user"}, {"content", user}}});
  std::string text = chat::render_chat_template(kEngineTemplate, msgs, nullptr, true, J::object(), "<|bos|>", "<|endoftext|>");
  std::vector<int32_t> ids32 = tok.encode(text, false);
  std::vector<int64_t> ids(ids32.begin(), ids32.end());
  Reference ref = reference_generate(dir, ids, 24);
  ASSERT_FALSE(ref.tokens.empty());

  J body = {{"messages", msgs}, {"max_tokens", 24}, {"temperature", 0}};
  J j = post_ok("/v1/chat/completions", body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], ref.text);
  EXPECT_EQ(j["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], ref.tokens.size() + (ref.eos ? 1 : 0));
  EXPECT_EQ(j["choices"][0]["finish_reason"], ref.eos ? "stop" : "length");
  EXPECT_EQ(j["model"], "m");

  body["stream"] = true;
  auto r = post("/v1/chat/completions", body);
  ASSERT_TRUE(r);
  EXPECT_EQ(sse_text(r->body, true), ref.text);

  // Completions: the raw prompt with the post-processor's BOS.
  std::vector<int32_t> c32 = tok.encode("hello world", true);
  Reference cref = reference_generate(dir, std::vector<int64_t>(c32.begin(), c32.end()), 16);
  J c = post_ok("/v1/completions", {{"prompt", "hello world"}, {"max_tokens", 16}, {"temperature", 0}});
  EXPECT_EQ(c["choices"][0]["text"], cref.text);

  // The same prompt as token ids (OpenAI's array of tokens): used as given, the same answer; an id
  // past the vocabulary is a 400 naming its element.
  J id_prompt = J::array();
  for (int32_t id : c32) id_prompt.push_back(id);
  J c_ids = post_ok("/v1/completions", {{"prompt", id_prompt}, {"max_tokens", 16}, {"temperature", 0}});
  EXPECT_EQ(c_ids["choices"][0]["text"], cref.text);
  EXPECT_EQ(c_ids["usage"]["prompt_tokens"], c32.size());
  id_prompt.push_back(512);  // the tiny vocabulary has 512 ids
  auto bad = post("/v1/completions", {{"prompt", id_prompt}, {"max_tokens", 2}});
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
  EXPECT_EQ(J::parse(bad->body)["error"]["param"], "prompt[" + std::to_string(c32.size()) + "]") << bad->body;
}

TEST_F(ModelServerTest, LogprobsAreTheLogSoftmaxOfEachStep) {
  fs::path dir = model_with_template(tmp_.path() / "m", "llama_mha", kEngineTemplate);
  start(cpu_options(dir));
  J body = {{"messages", J::array({{{"role", "user"}, {"content", "once upon a time"}}})},
            {"max_tokens", 6}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 4}};
  J c = post_ok("/v1/chat/completions", body);
  const J& content = c["choices"][0]["logprobs"]["content"];
  ASSERT_GT(content.size(), 0u);
  // Reference: a cache-free forward over prompt + generated tokens, log-softmax per step.
  Prompt p = engine_->prepare([&] {
    CompletionRequest r = chat_request("once upon a time", 6);
    return r;
  }());
  auto model = models::load_model(dir, {at::kCPU, at::kFloat});
  auto tok = tokenizer::Tokenizer::from_dir(dir);
  std::vector<int64_t> seq = p.ids;
  for (size_t i = 0; i < content.size(); ++i) {
    const J& e = content[i];
    at::Tensor logits = hearth::testing::logits_of(*model, at::tensor(seq, at::kLong).view({1, -1}))[0][-1];
    at::Tensor lp = at::log_softmax(logits, -1);
    const int64_t greedy = lp.argmax().item<int64_t>();
    const J& top = e["top_logprobs"];
    ASSERT_EQ(top.size(), 4u);
    for (size_t k = 1; k < top.size(); ++k) EXPECT_GE(top[k - 1]["logprob"].get<double>(), top[k]["logprob"].get<double>());
    EXPECT_EQ(e["token"], tok.decode({static_cast<int32_t>(greedy)}, false));
    EXPECT_NEAR(e["logprob"].get<double>(), lp[greedy].item<double>(), 1e-4);
    EXPECT_DOUBLE_EQ(e["logprob"].get<double>(), top[0]["logprob"].get<double>());  // greedy = most likely
    double mass = 0;
    for (const auto& t : top) mass += std::exp(t["logprob"].get<double>());
    EXPECT_LE(mass, 1.0 + 1e-6);
    auto [vals, idx] = at::topk(lp, 4);
    for (int64_t k = 0; k < 4; ++k) EXPECT_NEAR(top[k]["logprob"].get<double>(), vals[k].item<double>(), 1e-4);
    seq.push_back(greedy);
  }
}

TEST_F(ModelServerTest, RequestErrorsMapToStatuses) {
  fs::path dir = model_with_template(tmp_.path() / "m", "llama_mha", "");  // no chat template
  start(cpu_options(dir));
  auto r = post("/v1/chat/completions", {{"messages", J::array({{{"role", "user"}, {"content", "hi"}}})}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("no chat template"), std::string::npos) << r->body;
  std::string long_prompt;
  for (int i = 0; i < 300; ++i) long_prompt += " word";
  r = post("/v1/completions", {{"prompt", long_prompt}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(J::parse(r->body)["error"]["code"], "context_length_exceeded") << r->body;
  EXPECT_EQ(J::parse(r->body)["error"]["param"], "prompt") << r->body;
  EXPECT_NE(r->body.find("resulted in"), std::string::npos) << r->body;  // tokenized, then refused
  r = post("/v1/completions", {{"prompt", "hi"}, {"adapter", "ghost"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("ghost"), std::string::npos);
}

// A SentencePiece-style tokenizer (Metaspace decoder) for the 512-id golden model: id 0 is
// <unk> (also the model's EOS), 1..510 are "▁t<id>", 511 is the byte token <0xE9>.
void write_sentencepiece_tokenizer(const fs::path& dir) {
  J vocab = J::object();
  vocab["<unk>"] = 0;
  for (int i = 1; i < 511; ++i) vocab["\u2581t" + std::to_string(i)] = i;
  vocab["<0xE9>"] = 511;
  J tok = {{"version", "1.0"},
           {"added_tokens", J::array()},
           {"model", {{"type", "BPE"}, {"unk_token", "<unk>"}, {"byte_fallback", true}, {"vocab", vocab}, {"merges", J::array()}}},
           {"decoder", {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}}}};
  std::ofstream(dir / "tokenizer.json") << tok.dump();
  std::ofstream(dir / "tokenizer_config.json") << "{}";
}

TEST_F(ModelServerTest, ContinuationsDecodeAgainstTheirContext) {
  fs::path dir = model_with_template(tmp_.path() / "m", "llama_mha", "");
  write_sentencepiece_tokenizer(dir);
  start(cpu_options(dir));
  auto tok = tokenizer::Tokenizer::from_dir(dir);
  // Greedy completions of a few prompts: the text keeps the space of the first "▁tN" token (it
  // continues the prompt), and the logprob tokens/bytes add up to the text.
  int checked = 0;
  for (const char* prompt : {"abc", "hello there", "xyz q"}) {
    J c = post_ok("/v1/completions", {{"prompt", prompt}, {"max_tokens", 5}, {"temperature", 0}, {"logprobs", 2}});
    const std::string text = c["choices"][0]["text"];
    const J& lp = c["choices"][0]["logprobs"];
    std::string joined;
    for (const auto& t : lp["tokens"]) joined += t.get<std::string>();
    EXPECT_EQ(joined, text) << c.dump();
    if (text.empty()) continue;
    ++checked;
    EXPECT_TRUE(text[0] == ' ' || text.rfind("\xEF\xBF\xBD", 0) == 0) << "first token lost its space: " << text;
    J chat_like = post_ok("/v1/completions", {{"prompt", prompt}, {"max_tokens", 5}, {"temperature", 0}, {"stream", false}});
    EXPECT_EQ(chat_like["choices"][0]["text"], text);
  }
  EXPECT_GT(checked, 0) << "the model stopped at once for every prompt";
  // Chat logprobs: `bytes` are the token's raw bytes, including for a byte-fallback token.
  const std::string tmpl = "{% for m in messages %}{{ m.content }}{% endfor %}";
  J cfg = {{"chat_template", tmpl}};
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
  server_->stop();
  thread_.join();
  server_.reset();
  start(cpu_options(dir));
  J body = {{"messages", J::array({{{"role", "user"}, {"content", "once upon a time"}}})},
            {"max_tokens", 6}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 3}};
  J c = post_ok("/v1/chat/completions", body);
  std::string content = c["choices"][0]["message"]["content"].is_string() ? c["choices"][0]["message"]["content"].get<std::string>() : "";
  std::string from_bytes;
  for (const auto& e : c["choices"][0]["logprobs"]["content"]) {
    std::string bytes;
    for (const auto& b : e["bytes"]) bytes += static_cast<char>(b.get<int>());
    from_bytes += bytes;
    for (const auto& alt : e["top_logprobs"]) {
      // Every token but the byte token <0xE9> is valid UTF-8 on its own, so its bytes are its text.
      std::string ab;
      for (const auto& b : alt["bytes"]) ab += static_cast<char>(b.get<int>());
      const std::string t = alt["token"];
      EXPECT_EQ(ab, t == "\xEF\xBF\xBD" ? std::string("\xE9") : t);
    }
  }
  // A lone 0xE9 byte shows as U+FFFD in the text.
  for (size_t p = 0; (p = from_bytes.find('\xE9', p)) != std::string::npos; p += 3) from_bytes.replace(p, 1, "\xEF\xBF\xBD");
  EXPECT_EQ(from_bytes, content);
}

TEST_F(ModelServerTest, APromptFarBeyondTheContextIsRefusedBeforeTokenizing) {
  fs::path dir = model_with_template(tmp_.path() / "m", "llama_mha", kEngineTemplate);
  start(cpu_options(dir));
  // The bound: twice the longest vocabulary entry.
  auto tok = tokenizer::Tokenizer::from_dir(dir);
  size_t longest = 0;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) longest = std::max(longest, tok.id_to_token(id).size());
  ASSERT_GT(longest, 0u);
  EXPECT_EQ(engine_->max_token_bytes(), static_cast<int64_t>(2 * longest));
  const size_t most = static_cast<size_t>(engine_->context_length() * engine_->max_token_bytes());
  for (bool chat : {true, false}) {
    const std::string text(most + 1, 'a');
    auto r = chat ? post("/v1/chat/completions", {{"messages", J::array({{{"role", "user"}, {"content", text}}})}})
                  : post("/v1/completions", {{"prompt", text}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body.substr(0, 300);
    J e = J::parse(r->body)["error"];
    EXPECT_EQ(e["code"], "context_length_exceeded");
    EXPECT_EQ(e["param"], chat ? "messages" : "prompt");
    EXPECT_NE(e["message"].get<std::string>().find("bytes of text"), std::string::npos) << e;  // the early check
  }
  // Text the template may pull in from elsewhere counts too: a tool description, a name, a kwarg.
  const std::string big(most + 1, 'b');
  const J user = J::array({{{"role", "user"}, {"content", "hi"}}});
  for (const J& body : {J{{"messages", user}, {"tools", J::array({{{"type", "function"}, {"function", {{"name", "f"}, {"description", big}, {"parameters", {{"type", "object"}}}}}}})}},
                        J{{"messages", J::array({{{"role", "user"}, {"content", "hi"}, {"name", big}}})}},
                        J{{"messages", user}, {"chat_template_kwargs", {{"x", big}}}}}) {
    auto r = post("/v1/chat/completions", body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body.substr(0, 300);
    EXPECT_NE(r->body.find("bytes of text"), std::string::npos) << r->body.substr(0, 300);
  }
  EXPECT_EQ(post_ok("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}})["usage"]["completion_tokens"], 2);
}

// A hearth verb's stdout (stderr dropped), with `input` on stdin.
std::string cli_run(const std::string& args, const std::string& input = "") {
  std::string cmd = "printf '%s' '" + input + "' | " + std::string(HEARTH_BINARY) + " " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  EXPECT_EQ(WEXITSTATUS(pclose(p)), 0) << cmd;
  return out;
}

TEST_F(ModelServerTest, ChatAndGenerateCliShareThePromptPath) {
  fs::path dir = model_with_template(tmp_.path() / "m", "llama_mha", kEngineTemplate);
  const std::string model = "--model '" + dir.string() + "' --device cpu --max-tokens 10";
  // generate applies the chat template by default; the reference is the engine's own prompt.
  std::string gen = cli_run("generate " + model + " --prompt hi");
  ModelEngine engine(cpu_options(dir));
  CompletionRequest req = chat_request("hi", 10);
  Reference ref = reference_generate(dir, engine.prepare(req).ids, 10);
  EXPECT_EQ(gen, ref.text + "\n");
  EXPECT_EQ(cli_run("generate " + model + " --prompt -", "hi"), gen);  // '-' reads stdin
  // --ignore-chat-template sends the raw text (with the post-processor's BOS).
  std::vector<int32_t> raw = engine.tokenizer().encode("hi", true);
  EXPECT_EQ(cli_run("generate " + model + " --prompt hi --ignore-chat-template"),
            reference_generate(dir, std::vector<int64_t>(raw.begin(), raw.end()), 10).text + "\n");
  // chat: the first turn equals generate; /reset starts over (same reply); a second turn without
  // /reset sees the history (a different prompt); /exit ends before the last line.
  std::string chat = cli_run("chat " + model, "hi\n/reset\nhi\nhi\n/exit\nignored\n");
  ASSERT_EQ(chat.substr(0, 2 * gen.size()), gen + gen);
  req.messages.push_back(ChatMessage{"assistant", ref.text, "", "", {}});
  req.messages.push_back(ChatMessage{"user", "hi", "", "", {}});
  EXPECT_EQ(chat.substr(2 * gen.size()), reference_generate(dir, engine.prepare(req).ids, 10).text + "\n");
}

// hearth generate's stdout (the continuation line), stderr dropped.
std::string cli_generate(const std::string& args) {
  std::string cmd = std::string(HEARTH_BINARY) + " generate " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  EXPECT_EQ(WEXITSTATUS(pclose(p)), 0) << cmd;
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

TEST_F(ModelServerTest, AdapterRoutesMountSelectAndUnmount) {
  fs::path dir = model_with_template(tmp_.path() / "m", "llama_mha", kEngineTemplate);
  fs::copy(golden_lora("llama_mha"), dir / "adapters" / "lora", fs::copy_options::recursive);
  // A broken copy: adapter_config.json claims rank 8, the tensors have rank 4.
  fs::copy(golden_lora("llama_mha"), dir / "adapters" / "broken", fs::copy_options::recursive);
  J cfg = io::read_json(dir / "adapters" / "broken" / "adapter_config.json");
  cfg["r"] = 8;
  std::ofstream(dir / "adapters" / "broken" / "adapter_config.json") << cfg.dump();
  start(cpu_options(dir));

  auto status_of = [&](const J& body) {
    auto r = post("/v1/adapters", body);
    return r ? r->status : -1;
  };
  EXPECT_EQ(status_of({{"id", "x"}, {"path", golden_lora("llama_mha").string()}}), 403);  // outside the roots
  EXPECT_EQ(status_of({{"id", "x"}, {"path", (dir / "adapters" / "lora" / ".." / ".." / "..").string()}}), 403);
  EXPECT_EQ(status_of({{"id", "x"}, {"path", (dir / "adapters" / "missing").string()}}), 404);
  EXPECT_EQ(status_of({{"id", "x"}, {"path", (dir / "adapters" / "broken").string()}}), 400);
  EXPECT_EQ(status_of({{"id", "a+b"}, {"path", (dir / "adapters" / "lora").string()}}), 400);
  EXPECT_EQ(status_of({{"path", (dir / "adapters" / "lora").string()}}), 400);  // no id
  J m = post_ok("/v1/adapters", {{"id", "llama_mha"}, {"path", (dir / "adapters" / "lora").string()}});
  EXPECT_EQ(m["id"], "llama_mha");
  EXPECT_EQ(m["rank"], 4);
  EXPECT_EQ(m["modules"], 14);  // 7 projections x 2 layers
  EXPECT_EQ(m["format"], "peft");
  EXPECT_DOUBLE_EQ(m["scale"].get<double>(), 2.0);  // lora_alpha 8 / r 4
  EXPECT_EQ(status_of({{"id", "llama_mha"}, {"path", (dir / "adapters" / "lora").string()}}), 409);
  auto list = client().Get("/v1/adapters");
  ASSERT_TRUE(list);
  J l = J::parse(list->body);
  ASSERT_EQ(l["adapters"].size(), 1u);  // the failed mounts left nothing behind
  EXPECT_EQ(l["adapters"][0]["id"], "llama_mha");

  J req = {{"prompt", "hello world"}, {"max_tokens", 12}, {"temperature", 0}};
  J base = post_ok("/v1/completions", req);
  req["adapter"] = "none";
  J none = post_ok("/v1/completions", req);
  req["adapter"] = "llama_mha";
  J with = post_ok("/v1/completions", req);
  EXPECT_EQ(base["choices"][0]["text"], none["choices"][0]["text"]);
  EXPECT_NE(with["choices"][0]["text"], none["choices"][0]["text"]);
  // Same as the generation loop with the adapter mounted, and as `hearth generate --adapter-path`.
  auto tok = tokenizer::Tokenizer::from_dir(dir);
  std::vector<int32_t> ids = tok.encode("hello world", true);
  Reference ref = reference_generate(dir, std::vector<int64_t>(ids.begin(), ids.end()), 12, golden_lora("llama_mha"));
  EXPECT_EQ(with["choices"][0]["text"], ref.text);
  EXPECT_EQ(cli_generate("--model '" + dir.string() + "' --adapter-path '" + golden_lora("llama_mha").string() +
                         "' --prompt 'hello world' --ignore-chat-template --max-tokens 12 --device cpu"),
            ref.text);

  // A long streamed request with the adapter; DELETE sent once it has started streaming is
  // queued behind it, so the whole stream is generated with the adapter.
  J long_req = {{"prompt", "hello world"}, {"max_tokens", 200}, {"temperature", 0}, {"adapter", "llama_mha"}};
  J expected = post_ok("/v1/completions", long_req);
  long_req["stream"] = true;
  std::string streamed;
  std::future<httplib::Result> del;
  httplib::Request sreq;
  sreq.method = "POST";
  sreq.path = "/v1/completions";
  sreq.set_header("Content-Type", "application/json");
  sreq.body = long_req.dump();
  sreq.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    streamed.append(data, n);
    if (!del.valid()) del = std::async(std::launch::async, [this] { return client().Delete("/v1/adapters/llama_mha"); });
    return true;
  };
  auto sr = client().send(sreq);
  ASSERT_TRUE(sr);
  ASSERT_TRUE(del.valid());
  auto d = del.get();
  ASSERT_TRUE(d);
  EXPECT_EQ(d->status, 200) << d->body;
  EXPECT_EQ(sse_text(streamed, false), expected["choices"][0]["text"].get<std::string>());

  // Gone now: requests naming it are 400, a second DELETE is 404.
  auto r = post("/v1/completions", {{"prompt", "hi"}, {"adapter", "llama_mha"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  auto d2 = client().Delete("/v1/adapters/llama_mha");
  ASSERT_TRUE(d2);
  EXPECT_EQ(d2->status, 404);
  EXPECT_EQ(J::parse(client().Get("/v1/adapters")->body)["adapters"].size(), 0u);
  // Base output is unchanged after the round trip.
  EXPECT_EQ(post_ok("/v1/completions", {{"prompt", "hello world"}, {"max_tokens", 12}, {"temperature", 0}})["choices"][0]["text"],
            base["choices"][0]["text"]);
}

// The error body of `r`: status, and OpenAI's four fields with param/code as given ("" = null).
void expect_api_error(const httplib::Result& r, int status, const std::string& param, const std::string& code) {
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, status) << r->body;
  J e = J::parse(r->body)["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << r->body;
  EXPECT_EQ(e["type"], status >= 500 ? "server_error" : "invalid_request_error") << r->body;
  EXPECT_EQ(e["param"], param.empty() ? J() : J(param)) << r->body;
  EXPECT_EQ(e["code"], code.empty() ? J() : J(code)) << r->body;
}

TEST_F(ModelServerTest, DefaultAdapterCannotBeUnmountedAndAdapterErrorsKeepParamAndCode) {
  fs::path dir = model_with_template(tmp_.path() / "m", "llama_mha", kEngineTemplate);
  fs::copy(golden_lora("llama_mha"), dir / "adapters" / "lora", fs::copy_options::recursive);
  ModelEngineOptions o = cpu_options(dir);
  o.adapters.emplace_back("boot", golden_lora("llama_mha"));
  o.default_adapter = "boot";
  start(o);
  J req = {{"prompt", "hello world"}, {"max_tokens", 8}, {"temperature", 0}};
  const J before = post_ok("/v1/completions", req);
  expect_api_error(client().Delete("/v1/adapters/boot"), 409, "id", "adapter_in_use");
  ASSERT_EQ(J::parse(client().Get("/v1/adapters")->body)["adapters"].size(), 1u);
  // Requests without "adapter" still get the default, and it still differs from the base model.
  EXPECT_EQ(post_ok("/v1/completions", req)["choices"][0]["text"], before["choices"][0]["text"]);
  req["adapter"] = "none";
  EXPECT_NE(post_ok("/v1/completions", req)["choices"][0]["text"], before["choices"][0]["text"]);

  const std::string lora = (dir / "adapters" / "lora").string();
  expect_api_error(post("/v1/adapters", {{"id", "x"}, {"path", golden_lora("llama_mha").string()}}), 403, "path", "");
  expect_api_error(post("/v1/adapters", {{"id", "x"}, {"path", (dir / "adapters" / "missing").string()}}), 404, "path",
                   "adapter_not_found");
  expect_api_error(post("/v1/adapters", {{"id", "a+b"}, {"path", lora}}), 400, "id", "");
  post_ok("/v1/adapters", {{"id", "x"}, {"path", lora}});
  expect_api_error(post("/v1/adapters", {{"id", "x"}, {"path", lora}}), 409, "id", "adapter_exists");
  expect_api_error(post("/v1/adapters", {{"id", "m"}, {"path", lora}}), 409, "id", "adapter_exists");  // the model's id
  // 'model' naming one adapter and 'adapter' another: refused, not answered under the wrong name.
  expect_api_error(post("/v1/completions", {{"prompt", "hi"}, {"model", "x"}, {"adapter", "none"}}), 400, "adapter", "invalid_value");
  auto d = client().Delete("/v1/adapters/x");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->status, 200) << d->body;
  expect_api_error(client().Delete("/v1/adapters/x"), 404, "id", "adapter_not_found");
}

TEST_F(ModelServerTest, AdapterDirFlagAddsARootAndStartupAdaptersMount) {
  fs::path dir = model_with_template(tmp_.path() / "m", "llama_mha", kEngineTemplate);
  fs::create_directories(tmp_.path() / "extra");
  fs::copy(golden_lora("llama_mha"), tmp_.path() / "extra" / "lora", fs::copy_options::recursive);
  ModelEngineOptions o = cpu_options(dir);
  o.adapter_roots.push_back(tmp_.path() / "extra");
  o.adapters.emplace_back("boot", golden_lora("llama_mha"));
  start(o);
  J l = J::parse(client().Get("/v1/adapters")->body);
  ASSERT_EQ(l["adapters"].size(), 1u);
  EXPECT_EQ(l["adapters"][0]["id"], "boot");
  post_ok("/v1/adapters", {{"id", "extra"}, {"path", (tmp_.path() / "extra" / "lora").string()}});
  // Stacked selection of two copies of the same adapter differs from one.
  J req = {{"prompt", "hello world"}, {"max_tokens", 8}, {"temperature", 0}, {"adapter", "boot"}};
  J one = post_ok("/v1/completions", req);
  req["adapter"] = "boot+extra";
  J two = post_ok("/v1/completions", req);
  EXPECT_NE(one["choices"][0]["text"], two["choices"][0]["text"]);
}

}  // namespace
}  // namespace hearth::server
