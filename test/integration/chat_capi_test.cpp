// The chat template C API (nf_chat_apply_template, nf_model_params.
// chat_template_path) and its C++ wrapper on the pydoc-moe plan: loading
// (the template next to the tokenizer, or given explicitly; a broken one
// found next to the tokenizer is no load error, a broken explicit one is),
// the buffer convention, template errors, and the BOS the template writes
// itself. Expected prompts follow the templates' text (written out here),
// rendered for pydoc-moe's special tokens <s> and </s>.
#include "nf/nf.h"
#include "nf/nf.hpp"

#include "TestUtil.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

using namespace nf;
using ::testing::HasSubstr;

namespace {

std::string planPath() { return std::string(NF_PLAN_DIR) + "/pydoc-moe.nfb"; }
std::string templatePath(const std::string &name) {
  return test::testDataDir() + "/chat_templates/" + name;
}

/// A model loaded through the C API, freed at scope end.
struct Loaded {
  nf_model *m = nullptr;
  nf_status status;
  explicit Loaded(const nf_model_params &p) {
    status = nf_model_load(planPath().c_str(), &p, &m);
  }
  ~Loaded() { nf_model_free(m); }
};

std::string chatPrompt(const nf_model *m,
                       const std::vector<nf_chat_message> &msgs,
                       int addGenerationPrompt = 1) {
  std::vector<char> buf(4096);
  size_t n = 0;
  const nf_status s =
      nf_chat_apply_template(m, msgs.data(), msgs.size(), addGenerationPrompt,
                             buf.data(), buf.size(), &n);
  if (s != NF_OK)
    return std::string("ERROR ") + nf_status_string(s) + ": " + nf_last_error();
  return std::string(buf.data(), n);
}

TEST(ChatCApi, NoTemplate) {
  Loaded model(nf_model_default_params());
  ASSERT_EQ(model.status, NF_OK) << nf_last_error();
  EXPECT_EQ(nf_model_has_chat_template(model.m), 0);
  EXPECT_THAT(nf_model_info(model.m), HasSubstr("chat template: none\n"));
  const nf_chat_message msg = {"user", "hi"};
  size_t n = 0;
  char buf[16];
  EXPECT_EQ(nf_chat_apply_template(model.m, &msg, 1, 1, buf, sizeof buf, &n),
            NF_ERR_UNSUPPORTED);
  EXPECT_THAT(nf_last_error(), HasSubstr("the model has no chat template"));
  EXPECT_THAT(nf_last_error(), HasSubstr("chat_template_path"));
  EXPECT_EQ(nf_model_has_chat_template(nullptr), 0);
  EXPECT_STREQ(nf_model_chat_template_error(model.m), "");
  EXPECT_STREQ(nf_model_chat_template_error(nullptr), "");
}

TEST(ChatCApi, ExplicitTemplate) {
  nf_model_params p = nf_model_default_params();
  EXPECT_EQ(p.chat_template_path, nullptr);
  const std::string path = templatePath("mistral.jinja");
  p.chat_template_path = path.c_str();
  Loaded model(p);
  ASSERT_EQ(model.status, NF_OK) << nf_last_error();
  EXPECT_EQ(nf_model_has_chat_template(model.m), 1);
  EXPECT_THAT(nf_model_info(model.m),
              HasSubstr("chat template: " + path + "\n"));

  // The template's text, with the tokenizer's BOS and EOS (no
  // tokenizer_config.json next to pydoc-moe's tokenizer.json).
  const std::vector<nf_chat_message> conversation = {
      {"system", "Be brief."},
      {"user", "def f():"},
      {"assistant", "pass"},
      {"user", "Again \xc3\xa9"}};
  const std::string want =
      "<s> [INST] Be brief.\n\ndef f(): [/INST] pass</s> [INST] Again "
      "\xc3\xa9 [/INST]";
  EXPECT_EQ(chatPrompt(model.m, conversation), want);

  // The template writes the BOS: tokenized without special tokens, the
  // prompt starts with the BOS token, once.
  std::vector<int32_t> ids(256);
  size_t n = 0;
  ASSERT_EQ(nf_tokenize(model.m, want.data(), want.size(), 0, ids.data(),
                        ids.size(), &n),
            NF_OK);
  ASSERT_GE(n, 2u);
  EXPECT_EQ(ids[0], nf_model_bos(model.m));
  EXPECT_NE(ids[1], nf_model_bos(model.m));

  // raise_exception: an error with the template's message and line.
  const std::vector<nf_chat_message> twice = {{"user", "a"}, {"user", "b"}};
  EXPECT_THAT(chatPrompt(model.m, twice),
              HasSubstr("NF_ERR_INVALID_ARGUMENT: " + path +
                        ": chat template line 13: After the optional system "
                        "message, conversation roles must alternate "
                        "user/assistant/user/assistant/..."));
}

// Template variables (nf_chat_apply_template_vars), as keyword arguments
// of apply_chat_template: Nemotron 3 Nano's template (test/data) closes its
// think block in the generation prompt when enable_thinking is false.
TEST(ChatCApi, TemplateVariables) {
  nf_model_params p = nf_model_default_params();
  const std::string path = templatePath("nemotron3-nano.jinja");
  p.chat_template_path = path.c_str();
  Loaded model(p);
  ASSERT_EQ(model.status, NF_OK) << nf_last_error();
  const nf_chat_message msg = {"user", "hi"};
  auto render = [&](const char *vars) {
    std::vector<char> buf(4096);
    size_t n = 0;
    const nf_status s = nf_chat_apply_template_vars(model.m, &msg, 1, 1, vars,
                                                    buf.data(), buf.size(), &n);
    if (s != NF_OK)
      return std::string("ERROR ") + nf_status_string(s) + ": " +
             nf_last_error();
    return std::string(buf.data(), n);
  };
  const std::string on = render(nullptr);
  EXPECT_EQ(on, chatPrompt(model.m, {msg}));
  EXPECT_EQ(render(""), on);
  EXPECT_EQ(render("{\"enable_thinking\": true}"), on);
  const std::string suffix = "<|im_start|>assistant\n";
  ASSERT_GE(on.size(), suffix.size() + 8);
  EXPECT_EQ(on.substr(on.size() - suffix.size() - 8), suffix + "<think>\n");
  const std::string off = render("{\"enable_thinking\": false}");
  EXPECT_EQ(off, on.substr(0, on.size() - 8) + "<think></think>");
  // Not an object, not JSON, or a variable the call sets itself.
  EXPECT_THAT(render("[1]"), HasSubstr("NF_ERR_INVALID_ARGUMENT: "
                                       "nf_chat_apply_template: the template "
                                       "variables are not a JSON object"));
  EXPECT_THAT(render("{"), HasSubstr("are not a JSON object"));
  EXPECT_THAT(render("{\"messages\": []}"),
              HasSubstr("template variable \"messages\" is set by the "
                        "request itself"));
  // Messages as JSON (nf_chat_apply_template_json): the same prompt, and
  // tool calls and results, which the C strings of nf_chat_message cannot
  // carry.
  auto renderJson = [&](const char *messages, const char *vars) {
    std::vector<char> buf(8192);
    size_t n = 0;
    const nf_status s = nf_chat_apply_template_json(model.m, messages, 1, vars,
                                                    buf.data(), buf.size(), &n);
    if (s != NF_OK)
      return std::string("ERROR ") + nf_status_string(s) + ": " +
             nf_last_error();
    return std::string(buf.data(), n);
  };
  EXPECT_EQ(renderJson(R"([{"role": "user", "content": "hi"}])", nullptr), on);
  EXPECT_EQ(renderJson(R"([{"role": "user", "content": "hi"}])",
                       R"({"enable_thinking": false})"),
            off);
  const std::string withCall = renderJson(
      R"([{"role": "user", "content": "hi"},
          {"role": "assistant", "content": null, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather",
             "arguments": {"city": "Paris"}}}]},
          {"role": "tool", "content": "sunny"}])",
      nullptr);
  EXPECT_THAT(withCall, HasSubstr("<tool_call>\n<function=get_weather>\n"
                                  "<parameter=city>\nParis\n</parameter>"));
  EXPECT_THAT(withCall, HasSubstr("<tool_response>\nsunny\n</tool_response>"));
  EXPECT_THAT(renderJson("{", nullptr),
              HasSubstr("the messages are not a JSON array"));
  EXPECT_THAT(renderJson(R"([{"content": "x"}])", nullptr),
              HasSubstr("message 0 must be an object with a \"role\" string"));
  // The C++ wrapper passes them through.
  ModelParams params;
  params.chatTemplatePath = path;
  auto wrapped = Model::load(planPath(), params);
  ASSERT_TRUE(wrapped.ok()) << wrapped.message();
  auto text = wrapped->applyChatTemplate({{"user", "hi"}}, true,
                                         "{\"enable_thinking\": false}");
  ASSERT_TRUE(text.ok()) << text.message();
  EXPECT_EQ(*text, off);
}

TEST(ChatCApi, BufferConvention) {
  nf_model_params p = nf_model_default_params();
  const std::string path = templatePath("chatml.jinja");
  p.chat_template_path = path.c_str();
  Loaded model(p);
  ASSERT_EQ(model.status, NF_OK) << nf_last_error();
  const nf_chat_message msg = {"user", "Hello"};
  const std::string want = "<|im_start|>system\nYou are a helpful "
                           "assistant.<|im_end|>\n<|im_start|>user\nHello"
                           "<|im_end|>\n<|im_start|>assistant\n";
  // The size first (no buffer), then exactly that many bytes (no NUL), then
  // room for the NUL.
  size_t n = 0;
  EXPECT_EQ(nf_chat_apply_template(model.m, &msg, 1, 1, nullptr, 0, &n),
            NF_ERR_BUFFER_TOO_SMALL);
  EXPECT_EQ(n, want.size());
  std::vector<char> buf(want.size() + 1, 'x');
  n = 0;
  EXPECT_EQ(nf_chat_apply_template(model.m, &msg, 1, 1, buf.data(),
                                   want.size() - 1, &n),
            NF_ERR_BUFFER_TOO_SMALL);
  EXPECT_EQ(n, want.size());
  EXPECT_EQ(buf[0], 'x'); // untouched
  ASSERT_EQ(
      nf_chat_apply_template(model.m, &msg, 1, 1, buf.data(), want.size(), &n),
      NF_OK);
  EXPECT_EQ(std::string(buf.data(), n), want);
  EXPECT_EQ(buf[want.size()], 'x');
  ASSERT_EQ(
      nf_chat_apply_template(model.m, &msg, 1, 1, buf.data(), buf.size(), &n),
      NF_OK);
  EXPECT_EQ(buf[want.size()], '\0');
  // Without the generation prompt.
  EXPECT_EQ(chatPrompt(model.m, {msg}, 0),
            want.substr(0, want.size() -
                               std::string("<|im_start|>assistant\n").size()));

  // Bad arguments.
  EXPECT_EQ(
      nf_chat_apply_template(nullptr, &msg, 1, 1, buf.data(), buf.size(), &n),
      NF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(nf_chat_apply_template(model.m, nullptr, 1, 1, buf.data(),
                                   buf.size(), &n),
            NF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(nf_chat_apply_template(model.m, &msg, 1, 1, buf.data(), buf.size(),
                                   nullptr),
            NF_ERR_INVALID_ARGUMENT);
  const nf_chat_message nullContent = {"user", nullptr};
  EXPECT_EQ(nf_chat_apply_template(model.m, &nullContent, 1, 1, buf.data(),
                                   buf.size(), &n),
            NF_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(nf_last_error(), HasSubstr("message 0 has a NULL role or "
                                         "content"));
  const nf_chat_message latin1 = {"user", "caf\xe9"};
  EXPECT_EQ(nf_chat_apply_template(model.m, &latin1, 1, 1, buf.data(),
                                   buf.size(), &n),
            NF_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(nf_last_error(), HasSubstr("UTF-8"));

  // Read-only: threads may render at once.
  std::vector<std::string> results(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i)
    threads.emplace_back([&, i] { results[i] = chatPrompt(model.m, {msg}); });
  for (auto &t : threads)
    t.join();
  for (const std::string &r : results)
    EXPECT_EQ(r, want);
}

TEST(ChatCApi, CppWrapper) {
  ModelParams params;
  params.chatTemplatePath = templatePath("chatml.jinja");
  auto model = Model::load(planPath(), params);
  ASSERT_TRUE(model.ok()) << model.message();
  EXPECT_TRUE(model->hasChatTemplate());
  EXPECT_EQ(model->chatTemplateError(), "");
  // Longer than the wrapper's first buffer: it asks again with the size.
  const std::string longText(10000, 'z');
  auto text = model->applyChatTemplate({{"user", longText}}, false);
  ASSERT_TRUE(text.ok()) << text.message();
  EXPECT_EQ(*text, "<|im_start|>system\nYou are a helpful assistant."
                   "<|im_end|>\n<|im_start|>user\n" +
                       longText + "<|im_end|>\n");
  // Roles and contents go through C strings: a NUL would cut them short,
  // so it is refused.
  auto nul = model->applyChatTemplate(
      {{"user", "ab"}, {"user", std::string("a\0b", 3)}}, false);
  ASSERT_FALSE(nul.ok());
  EXPECT_EQ(nul.message(),
            "message 1: role and content must not contain NUL characters");
  EXPECT_FALSE(
      model->applyChatTemplate({{std::string("us\0er", 6), "x"}}).ok());
  auto plain = Model::load(planPath());
  ASSERT_TRUE(plain.ok()) << plain.message();
  EXPECT_FALSE(plain->hasChatTemplate());
  auto none = plain->applyChatTemplate({{"user", "x"}});
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.message(), HasSubstr("no chat template"));
}

TEST(ChatCApi, TemplateNextToTheTokenizer) {
  test::TempDir dir;
  std::filesystem::copy_file(test::examplesDir() + "/pydoc-moe/tokenizer.json",
                             dir.file("tokenizer.json"));
  const std::string tokenizer = dir.file("tokenizer.json");
  nf_model_params p = nf_model_default_params();
  p.tokenizer_path = tokenizer.c_str();

  // tokenizer_config.json's template and special tokens (not the
  // tokenizer's own).
  test::writeFile(dir.file("tokenizer_config.json"),
                  R"({"bos_token": "<pad>", "eos_token": {"content": "<s>"},
                      "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}"})");
  {
    Loaded model(p);
    ASSERT_EQ(model.status, NF_OK) << nf_last_error();
    EXPECT_EQ(nf_model_has_chat_template(model.m), 1);
    EXPECT_EQ(chatPrompt(model.m, {{"user", "x"}}), "<pad>user: x<s>");
  }
  // chat_template.jinja wins over tokenizer_config.json.
  test::writeFile(dir.file("chat_template.jinja"),
                  "[{{ messages|length }}]{{ eos_token }}\n");
  {
    Loaded model(p);
    ASSERT_EQ(model.status, NF_OK) << nf_last_error();
    EXPECT_EQ(chatPrompt(model.m, {{"user", "x"}, {"assistant", "y"}}),
              "[2]<s>");
  }
  // A template there that does not parse does not fail the load: the
  // model works, without a chat template, and says why (naming the file
  // and line) in nf_model_chat_template_error, nf_model_info and the
  // error of nf_chat_apply_template.
  test::writeFile(dir.file("chat_template.jinja"), "ok\n{% for %}");
  {
    Loaded model(p);
    ASSERT_EQ(model.status, NF_OK) << nf_last_error();
    EXPECT_EQ(nf_model_has_chat_template(model.m), 0);
    const std::string why = nf_model_chat_template_error(model.m);
    EXPECT_THAT(why, ::testing::StartsWith(dir.file("chat_template.jinja") +
                                           ": chat template line 2: "));
    EXPECT_THAT(nf_model_info(model.m),
                HasSubstr("chat template: none (" + why + ")\n"));
    EXPECT_EQ(chatPrompt(model.m, {{"user", "x"}}),
              "ERROR NF_ERR_UNSUPPORTED: the model's chat template cannot be "
              "used: " +
                  why + "; give one with nf_model_params.chat_template_path");
    std::vector<int32_t> ids(16);
    size_t n = 0;
    EXPECT_EQ(nf_tokenize(model.m, "hello", 5, 0, ids.data(), ids.size(), &n),
              NF_OK);
  }
  // So does an unsupported tag, a tokenizer_config.json that is not JSON,
  // and a template list without "default".
  std::filesystem::remove(dir.file("chat_template.jinja"));
  for (const auto &[config, reason] :
       std::vector<std::pair<std::string, std::string>>{
           {R"({"chat_template": "{% include 'x.jinja' %}"})",
            ": chat template line 1: unsupported tag 'include'"},
           {"{\"chat_template\": ", ": not a JSON object"},
           {R"({"chat_template": [{"name": "tool_use", "template": "x"}]})",
            ": 'chat_template' has no template named 'default'"}}) {
    test::writeFile(dir.file("tokenizer_config.json"), config);
    Loaded model(p);
    ASSERT_EQ(model.status, NF_OK) << nf_last_error();
    EXPECT_EQ(nf_model_has_chat_template(model.m), 0);
    EXPECT_EQ(std::string(nf_model_chat_template_error(model.m)),
              dir.file("tokenizer_config.json") + reason);
  }
  test::writeFile(dir.file("chat_template.jinja"), "ok\n{% for %}");
  // ... unless an explicit template replaces it.
  const std::string explicitPath = templatePath("chatml.jinja");
  p.chat_template_path = explicitPath.c_str();
  {
    Loaded model(p);
    ASSERT_EQ(model.status, NF_OK) << nf_last_error();
    EXPECT_THAT(chatPrompt(model.m, {{"user", "x"}}),
                HasSubstr("<|im_start|>"));
  }
  // With an explicit template, a malformed tokenizer_config.json (where its
  // special tokens come from) fails the load.
  test::writeFile(dir.file("tokenizer_config.json"), "{\"bos_token\": ");
  {
    Loaded model(p);
    EXPECT_EQ(model.status, NF_ERR_LOAD);
    EXPECT_EQ(std::string(nf_last_error()),
              dir.file("tokenizer_config.json") + ": not a JSON object");
  }
  // A missing explicit template too, and one that does not parse.
  std::filesystem::remove(dir.file("tokenizer_config.json"));
  p.chat_template_path = nullptr;
  {
    // (the broken chat_template.jinja, found: not fatal)
    Loaded model(p);
    ASSERT_EQ(model.status, NF_OK) << nf_last_error();
  }
  const std::string broken = dir.file("chat_template.jinja");
  p.chat_template_path = broken.c_str();
  {
    Loaded model(p);
    EXPECT_EQ(model.status, NF_ERR_LOAD);
    EXPECT_EQ(model.m, nullptr);
    EXPECT_THAT(nf_last_error(),
                HasSubstr(broken + ": chat template line 2: "));
  }
  const std::string missing = dir.file("missing.jinja");
  p.chat_template_path = missing.c_str();
  {
    Loaded model(p);
    EXPECT_EQ(model.status, NF_ERR_LOAD);
    EXPECT_EQ(std::string(nf_last_error()),
              missing + ": cannot open: No such file or directory");
  }
}

} // namespace
