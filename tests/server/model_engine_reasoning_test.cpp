// Chat-format plumbing of the real ModelEngine on the tiny golden Qwen3 model (CPU fp32) whose
// tokenizer is given <think>/</think> special tokens: reasoning-format detection, the primed
// prompt, `--thinking` as the enable_thinking default, special markers reaching the splitter,
// reasoning_content through HTTP (streamed = non-streamed = the plain generation loop), and the
// EOS union (config.json ∪ generation_config.json ∪ tokenizer). Also MarkerStreamDecoder alone.
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <thread>

#include "../adapters/lora_test_util.h"
#include "../io/io_test_util.h"
#include "server/marker_decoder.h"
#include "server/model_engine.h"
#include "server/server.h"

namespace hearth::server {
namespace {

namespace fs = std::filesystem;
using J = nlohmann::json;
using hearth::testing::golden_model;
using hearth::testing::TempDir;

constexpr int32_t kThink = 510, kEndThink = 511;  // ids given to <think> / </think> (model vocab is 512)

const char* kTemplate =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking %}<think>\n{% endif %}{% endif %}";

// The golden qwen3 model with a chat template and <think>/</think> as special added tokens.
fs::path thinking_model(const fs::path& dir, const std::string& tmpl = kTemplate) {
  fs::copy(golden_model("qwen3"), dir, fs::copy_options::recursive);
  J cfg = io::read_json(dir / "tokenizer_config.json");
  cfg["chat_template"] = tmpl;
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump(1);
  // Added tokens take the vocabulary's id when their text is in it (else the next free id, which
  // the model could not embed): the vocabulary entries kThink/kEndThink are renamed, and the merges
  // that made or used the old pieces dropped.
  J tok = io::read_json(dir / "tokenizer.json");
  J& vocab = tok["model"]["vocab"];
  for (auto [id, content] : {std::pair{kThink, "<think>"}, std::pair{kEndThink, "</think>"}}) {
    std::string old;
    for (auto it = vocab.begin(); it != vocab.end(); ++it)
      if (it.value() == id) old = it.key();
    vocab.erase(old);
    vocab[content] = id;
    J kept = J::array();
    for (const auto& m : tok["model"]["merges"]) {
      std::string a, b;
      if (m.is_array()) a = m[0], b = m[1];
      else a = m.get<std::string>().substr(0, m.get<std::string>().find(' ')), b = m.get<std::string>().substr(a.size() + 1);
      if (a != old && b != old && a + b != old) kept.push_back(m);
    }
    tok["model"]["merges"] = kept;
    tok["added_tokens"].push_back(J{{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                                    {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  std::ofstream(dir / "tokenizer.json") << tok.dump();
  return dir;
}

ModelEngineOptions cpu(const fs::path& dir) {
  ModelEngineOptions o;
  o.model_dir = dir;
  o.device = "cpu";
  o.dtype = "float32";
  o.prompt_cache_bytes = 0;
  return o;
}

CompletionRequest chat(const std::string& user, int64_t max_tokens) {
  CompletionRequest r;
  r.messages.push_back(ChatMessage{"user", user, "", "", {}, std::nullopt});
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0;
  return r;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \n\t\r"), e = s.find_last_not_of(" \n\t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

class EngineReasoningTest : public ::testing::Test {
 protected:
  void serve(ModelEngine& engine) {
    ServerOptions so;
    so.port = 0;
    server_ = std::make_unique<Server>(engine, so);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->serve(); });
  }
  void TearDown() override {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
  }
  // {reasoning_content (or "<none>"), content} of a chat request, non-streamed and streamed.
  std::pair<std::string, std::string> ask(const std::string& body, bool stream) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    J b = J::parse(body);
    b["stream"] = stream;
    auto r = c.Post("/v1/chat/completions", b.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    if (!r) return {};
    if (!stream) {
      J msg = J::parse(r->body)["choices"][0]["message"];
      return {msg.contains("reasoning_content") ? msg["reasoning_content"].get<std::string>() : "<none>",
              msg["content"].get<std::string>()};
    }
    std::string reasoning = "<none>", content;
    for (size_t pos = 0; (pos = r->body.find("data: {", pos)) != std::string::npos;) {
      size_t end = r->body.find("\n\n", pos);
      J d = J::parse(r->body.substr(pos + 6, end - pos - 6))["choices"][0]["delta"];
      if (d.contains("reasoning_content"))
        reasoning = (reasoning == "<none>" ? "" : reasoning) + d["reasoning_content"].get<std::string>();
      if (d.contains("content")) content += d["content"].get<std::string>();
      pos = end;
    }
    return {reasoning, content};
  }
  TempDir tmp_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
};

TEST_F(EngineReasoningTest, DetectsThinkTagsAndThePrimedPromptAndAppliesTheThinkingDefault) {
  fs::path dir = thinking_model(tmp_.path() / "m");
  ModelEngine engine(cpu(dir));
  EXPECT_EQ(engine.reasoning_format(), chat::ReasoningFormat::ThinkTags);
  CompletionRequest req = chat("hi", 4);
  Prompt p = engine.prepare(req);
  EXPECT_FALSE(p.reasoning_open);  // the template's default: no thinking
  req.chat_template_kwargs["enable_thinking"] = true;
  p = engine.prepare(req);
  EXPECT_TRUE(p.reasoning_open);
  EXPECT_NE(std::find(p.ids.begin(), p.ids.end(), kThink), p.ids.end()) << "<think> is one special token";

  ModelEngineOptions on = cpu(dir);
  on.thinking = true;
  ModelEngine e_on(on);
  CompletionRequest plain = chat("hi", 4);
  EXPECT_TRUE(e_on.prepare(plain).reasoning_open);  // the serve default applies
  plain.chat_template_kwargs["enable_thinking"] = false;
  EXPECT_FALSE(e_on.prepare(plain).reasoning_open);  // the request wins

  ModelEngineOptions off = cpu(dir);
  off.thinking = false;
  off.defaults.temperature = 1.0;
  ModelEngine e_off(off);
  CompletionRequest t = chat("hi", 4);
  t.sampling.temperature.reset();
  EXPECT_FALSE(e_off.prepare(t).reasoning_open);
  EXPECT_DOUBLE_EQ(e_off.resolve_sampling(t).temperature, 0.7);  // thinking off: min(1.0, 0.7)
  t.chat_template_kwargs["enable_thinking"] = true;
  EXPECT_DOUBLE_EQ(e_off.resolve_sampling(t).temperature, 1.0);
}

TEST_F(EngineReasoningTest, AssistantReasoningContentReachesTheTemplate) {
  fs::path dir = thinking_model(tmp_.path() / "m",
                                "{% for m in messages %}{{ m.role }}:{% if m.reasoning_content %}<think>"
                                "{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}\n{% endfor %}");
  ModelEngine engine(cpu(dir));
  CompletionRequest req = chat("a", 4);
  req.messages.push_back(ChatMessage{"assistant", "b", "", "", {}, "thought b"});
  req.messages.push_back(ChatMessage{"user", "c", "", "", {}, std::nullopt});
  EXPECT_EQ(engine.prepare(req).text, "user:a\nassistant:<think>thought b</think>b\nuser:c\n");
}

TEST_F(EngineReasoningTest, PrimedOutputIsReasoningContentStreamedAndNotEqualToTheGenerationLoop) {
  fs::path dir = thinking_model(tmp_.path() / "m");
  ModelEngine engine(cpu(dir));
  // The reference: the same prompt through the plain generation loop.
  CompletionRequest req = chat("hello there", 12);
  req.chat_template_kwargs["enable_thinking"] = true;
  Prompt p = engine.prepare(req);
  std::vector<int32_t> ids;
  engine.generate(p, req, [&](const TokenEvent& ev) {
    if (!ev.text_only) ids.push_back(static_cast<int32_t>(ev.id));
    return true;
  });
  ASSERT_EQ(std::count(ids.begin(), ids.end(), kEndThink) + std::count(ids.begin(), ids.end(), kThink), 0)
      << "pick other marker ids for this model";
  const std::string expected = trim(engine.tokenizer().decode(ids, true));
  ASSERT_FALSE(expected.empty());
  serve(engine);
  const std::string body =
      R"({"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 12, "temperature": 0,)"
      R"( "chat_template_kwargs": {"enable_thinking": true}})";
  for (bool stream : {false, true}) {
    auto [reasoning, content] = ask(body, stream);
    EXPECT_EQ(reasoning, expected) << "stream " << stream;
    EXPECT_EQ(content, "") << "stream " << stream;
  }
}

TEST_F(EngineReasoningTest, SpecialMarkersReachTheSplitterOtherSpecialsStayHidden) {
  fs::path dir = thinking_model(tmp_.path() / "m");
  ModelEngine engine(cpu(dir));
  serve(engine);
  // Every sampled token is <think> (a special token): skipped, it would leave no text at all;
  // visible, the first opens a thought and the rest are its text.
  const std::string body =
      R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "temperature": 0, "logit_bias": {")" +
      std::to_string(kThink) + R"(": 100}})";
  for (bool stream : {false, true}) {
    auto [reasoning, content] = ask(body, stream);
    EXPECT_EQ(reasoning, "<think><think><think>") << "stream " << stream;
    EXPECT_EQ(content, "") << "stream " << stream;
  }
  // Completions keep skipping special tokens.
  httplib::Client c("127.0.0.1", port_);
  auto r = c.Post("/v1/completions",
                  R"({"prompt": "x", "max_tokens": 3, "temperature": 0, "logit_bias": {")" + std::to_string(kThink) +
                      R"(": 100}})",
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(J::parse(r->body)["choices"][0]["text"], "");
}

TEST_F(EngineReasoningTest, EosIsTheUnionOfConfigGenerationConfigAndTokenizer) {
  fs::path dir = thinking_model(tmp_.path() / "m");
  J cfg = io::read_json(dir / "config.json");
  cfg["eos_token_id"] = J::array({5, 9});
  std::ofstream(dir / "config.json") << cfg.dump();
  J gc = io::read_json(dir / "generation_config.json");
  gc["eos_token_id"] = 7;
  std::ofstream(dir / "generation_config.json") << gc.dump();
  ModelEngine engine(cpu(dir));
  EXPECT_EQ(engine.eos_ids(), (std::vector<int64_t>{0, 5, 7, 9}));  // 0: tokenizer <|endoftext|>
  // Gemma 4 keeps it under text_config in some exports; a wrong type is one clear error.
  cfg.erase("eos_token_id");
  cfg["text_config"] = J{{"eos_token_id", 11}};
  std::ofstream(dir / "config.json") << cfg.dump();
  ModelEngine e2(cpu(dir));
  EXPECT_EQ(e2.eos_ids(), (std::vector<int64_t>{0, 7, 11}));
  cfg["eos_token_id"] = "two";
  std::ofstream(dir / "config.json") << cfg.dump();
  try {
    ModelEngine bad(cpu(dir));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json: eos_token_id must be an integer or a list of integers"),
              std::string::npos)
        << e.what();
  }
}

TEST(MarkerStreamDecoder, ShowsChosenSpecialTokensInOrderAndHidesTheRest) {
  // ByteLevel vocabulary: a b Ġ(space) Ċ(newline); specials <|channel> <channel|> <eos>; <x> added, not special.
  const std::string json = R"({"version":"1.0","added_tokens":[
      {"id":5,"content":"<|channel>","special":true,"normalized":false},
      {"id":6,"content":"<channel|>","special":true,"normalized":false},
      {"id":7,"content":"<eos>","special":true,"normalized":false},
      {"id":8,"content":"<x>","special":false,"normalized":false}],
    "decoder":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},
    "model":{"type":"BPE","vocab":{"a":0,"b":1,"\u0120":2,"\u010a":3,"\u0120a":4},"merges":[]}})";
  auto tok = tokenizer::Tokenizer::from_json_text(json, "t.json");
  EXPECT_EQ(special_marker_ids(tok, {"<channel|>", "<|channel>", "<x>", "<nope>", ""}), (std::vector<int32_t>{5, 6}));
  const std::vector<int32_t> ids{5, 0, 3, 1, 6, 4, 7, 8, 2, 0};
  MarkerStreamDecoder d(tok, {5, 6});
  std::string out;
  for (int32_t id : ids) out += d.push(id);
  out += d.flush();
  EXPECT_EQ(out, "<|channel>a\nb<channel|> a<x> a");
  // Without visible markers it is the plain skipping decoder.
  MarkerStreamDecoder plain(tok, {});
  out.clear();
  for (int32_t id : ids) out += plain.push(id);
  out += plain.flush();
  EXPECT_EQ(out, tok.decode(ids, true));
  EXPECT_EQ(out, "a\nb a<x> a");
}

}  // namespace
}  // namespace hearth::server
