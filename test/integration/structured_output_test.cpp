// Structured output through libnf's serving engine (pydoc-moe, CPU): the
// grammar's mask, checked against references that do not use the grammar
// engine (XGrammar): the set of tokens that keep the text a prefix of a
// finite language, computed here from the vocabulary, and a JSON parser.
#include "nf/nf.hpp"

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

namespace {

std::string planPath() { return std::string(NF_PLAN_DIR) + "/pydoc-moe.nfb"; }

nf::Model load() {
  nf::ModelParams p;
  p.backend = "cpu";
  auto m = nf::Model::load(planPath(), p);
  EXPECT_TRUE(m.ok()) << m.message();
  return std::move(*m);
}

/// Every token's text (special tokens: "").
std::vector<std::string> vocabularyText(const nf::Model &m) {
  std::vector<std::string> text(static_cast<size_t>(m.vocabSize()));
  for (int32_t t = 0; t < m.vocabSize(); ++t) {
    auto s = m.detokenize({t});
    text[static_cast<size_t>(t)] = s.ok() ? *s : std::string();
  }
  return text;
}

nf::RequestParams request(const std::vector<int32_t> &prompt,
                          nf_grammar_kind kind, std::string grammar,
                          int32_t maxTokens) {
  nf::RequestParams p;
  p.prompt = prompt;
  p.maxTokens = maxTokens;
  p.grammarKind = kind;
  p.grammar = std::move(grammar);
  return p;
}

// A finite language (one of a few strings): greedy decoding under its
// grammar draws, at every step, the token of the highest logit among those
// that keep the text a prefix of one of the strings (EOS where the text is
// one of them). The logits come from the whole context in one step of a
// model of its own; the allowed set from the vocabulary's text.
TEST(StructuredOutput, GreedyDrawsTheBestTokenTheGrammarAllows) {
  nf::Model reference = load();
  nf::Model model = load();
  const std::vector<std::string> choices = {
      "def add(a, b):", "class Stack(object):", "import os", "# TODO"};
  std::string ebnf = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i)
    ebnf += (i ? " | " : "") + nlohmann::json(choices[i]).dump();
  const std::vector<std::string> vocab = vocabularyText(model);
  auto engine = nf::ServingEngine::create(model);
  ASSERT_TRUE(engine.ok()) << engine.message();
  const std::vector<std::string> prompts = {
      "\"\"\"Utilities for numbers.\"\"\"\n\n", "import sys\n",
      "class Queue:\n    pass\n\n\n"};
  const size_t width = static_cast<size_t>(model.vocabSize());
  for (const std::string &text : prompts) {
    auto prompt = model.tokenize(text);
    ASSERT_TRUE(prompt.ok()) << prompt.message();
    auto r = engine->submit(request(*prompt, NF_GRAMMAR_EBNF, ebnf, 24));
    ASSERT_TRUE(r.ok()) << r.message();
    auto out = r->wait();
    ASSERT_TRUE(out.ok()) << out.message();
    ASSERT_EQ(out->finishReason, NF_FINISH_STOP) << out->error;
    EXPECT_NE(std::find(choices.begin(), choices.end(), out->text),
              choices.end())
        << "'" << out->text << "' is not one of the choices";
    std::vector<int32_t> context = *prompt;
    context.insert(context.end(), out->tokens.begin(), out->tokens.end());
    auto seq = reference.addSequence();
    ASSERT_TRUE(seq.ok());
    std::vector<float> logits;
    ASSERT_TRUE(reference.decode({{*seq, context}}, true, logits).ok());
    ASSERT_TRUE(reference.removeSequence(*seq).ok());
    std::string so_far;
    for (size_t g = 0; g < out->tokens.size(); ++g) {
      const float *row = &logits[(prompt->size() - 1 + g) * width];
      float best = -std::numeric_limits<float>::infinity();
      for (size_t t = 0; t < width; ++t) {
        bool allowed;
        if (model.isEos(static_cast<int32_t>(t))) {
          allowed = std::find(choices.begin(), choices.end(), so_far) !=
                    choices.end();
        } else {
          const std::string next = so_far + vocab[t];
          allowed = !vocab[t].empty() &&
                    std::any_of(choices.begin(), choices.end(),
                                [&](const std::string &c) {
                                  return c.compare(0, next.size(), next) == 0;
                                });
        }
        if (allowed)
          best = std::max(best, row[t]);
      }
      const int32_t token = out->tokens[g];
      EXPECT_EQ(row[token], best)
          << "step " << g << " of '" << text << "': token " << token << " ('"
          << vocab[static_cast<size_t>(token)] << "')";
      if (!model.isEos(token))
        so_far += vocab[static_cast<size_t>(token)];
    }
  }
}

// Sampled at temperature 1 (the model writes Python, not JSON, when left
// alone): every answer that ends is JSON that satisfies the schema. Without
// whitespace between tokens: this model, left any, writes only that.
TEST(StructuredOutput, SampledAnswersSatisfyTheJsonSchema) {
  nf::Model model = load();
  auto engine = nf::ServingEngine::create(model);
  ASSERT_TRUE(engine.ok()) << engine.message();
  const std::string schema = R"({
    "type": "object",
    "properties": {
      "kind": {"enum": ["function", "class", "module"]},
      "arguments": {"type": "integer", "minimum": 0, "maximum": 9},
      "public": {"type": "boolean"}
    },
    "required": ["kind", "arguments", "public"],
    "additionalProperties": false
  })";
  auto prompt = model.tokenize("def add(a, b):\n    \"\"\"Return the sum");
  ASSERT_TRUE(prompt.ok());
  std::vector<nf::ServingRequest> requests;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    nf::RequestParams p =
        request(*prompt, NF_GRAMMAR_JSON_SCHEMA, schema, /*maxTokens=*/96);
    p.sampler.temperature = 1.0f;
    p.sampler.seed = seed;
    p.grammarFlags = NF_GRAMMAR_FLAG_NO_WHITESPACE;
    auto r = engine->submit(p);
    ASSERT_TRUE(r.ok()) << r.message();
    requests.push_back(std::move(*r));
  }
  int ended = 0;
  for (auto &r : requests) {
    auto out = r.wait();
    ASSERT_TRUE(out.ok()) << out.message();
    ASSERT_NE(out->finishReason, NF_FINISH_ERROR) << out->error;
    if (out->finishReason != NF_FINISH_STOP)
      continue;
    ++ended;
    auto doc = nlohmann::json::parse(out->text, nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << "not JSON: " << out->text;
    ASSERT_TRUE(doc.is_object()) << out->text;
    EXPECT_EQ(doc.size(), 3u) << out->text;
    ASSERT_TRUE(doc.contains("kind") && doc["kind"].is_string()) << out->text;
    const std::string kind = doc["kind"];
    EXPECT_TRUE(kind == "function" || kind == "class" || kind == "module")
        << out->text;
    ASSERT_TRUE(doc.contains("arguments") &&
                doc["arguments"].is_number_integer())
        << out->text;
    EXPECT_GE(doc["arguments"].get<int>(), 0);
    EXPECT_LE(doc["arguments"].get<int>(), 9);
    EXPECT_TRUE(doc.contains("public") && doc["public"].is_boolean())
        << out->text;
  }
  EXPECT_GE(ended, 4) << "most answers were meant to end within 96 tokens";
}

// A regex and the JSON of OpenAI's json_object.
TEST(StructuredOutput, RegexAndAnyJson) {
  nf::Model model = load();
  auto engine = nf::ServingEngine::create(model);
  ASSERT_TRUE(engine.ok()) << engine.message();
  auto prompt = model.tokenize("# Version\n");
  ASSERT_TRUE(prompt.ok());
  auto version = engine->submit(
      request(*prompt, NF_GRAMMAR_REGEX, R"(v[0-9]\.[0-9]{1,2})", 16));
  ASSERT_TRUE(version.ok()) << version.message();
  auto v = version->wait();
  ASSERT_TRUE(v.ok());
  ASSERT_EQ(v->finishReason, NF_FINISH_STOP) << v->error;
  ASSERT_GE(v->text.size(), 4u);
  EXPECT_EQ(v->text[0], 'v');
  EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(v->text[1])));
  EXPECT_EQ(v->text[2], '.');
  EXPECT_LE(v->text.size(), 5u) << v->text;
  for (size_t i = 3; i < v->text.size(); ++i)
    EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(v->text[i])))
        << v->text;
  auto json = engine->submit(request(*prompt, NF_GRAMMAR_JSON, "", 48));
  ASSERT_TRUE(json.ok()) << json.message();
  auto j = json->wait();
  ASSERT_TRUE(j.ok());
  ASSERT_NE(j->finishReason, NF_FINISH_ERROR) << j->error;
  ASSERT_FALSE(j->text.empty());
  EXPECT_EQ(j->text[0], '{') << j->text;
  if (j->finishReason == NF_FINISH_STOP)
    EXPECT_FALSE(nlohmann::json::parse(j->text, nullptr, false).is_discarded())
        << j->text;
}

// A grammar that applies after given tokens (a reasoning block's end): the
// output runs free, as it does without the grammar, up to them, then
// matches the grammar.
TEST(StructuredOutput, GrammarAppliesAfterItsTokens) {
  nf::Model model = load();
  auto engine = nf::ServingEngine::create(model);
  ASSERT_TRUE(engine.ok()) << engine.message();
  auto prompt = model.tokenize("def add(a, b):\n");
  ASSERT_TRUE(prompt.ok());
  auto free = engine->submit(request(*prompt, NF_GRAMMAR_NONE, "", 8));
  ASSERT_TRUE(free.ok());
  auto f = free->wait();
  ASSERT_TRUE(f.ok());
  ASSERT_GE(f->tokens.size(), 3u);
  const std::vector<std::string> choices = {"yes", "no"};
  nf::RequestParams p =
      request(*prompt, NF_GRAMMAR_EBNF, "root ::= \"yes\" | \"no\"", 16);
  p.grammarAfter = {f->tokens[1], f->tokens[2]};
  auto r = engine->submit(p);
  ASSERT_TRUE(r.ok()) << r.message();
  auto out = r->wait();
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->finishReason, NF_FINISH_STOP) << out->error;
  ASSERT_GT(out->tokens.size(), 3u);
  EXPECT_TRUE(std::equal(f->tokens.begin(), f->tokens.begin() + 3,
                         out->tokens.begin()));
  auto head = model.detokenize(
      std::vector<int32_t>(f->tokens.begin(), f->tokens.begin() + 3));
  ASSERT_TRUE(head.ok());
  ASSERT_EQ(out->text.compare(0, head->size(), *head), 0) << out->text;
  const std::string rest = out->text.substr(head->size());
  EXPECT_TRUE(rest == "yes" || rest == "no") << "'" << rest << "'";
}

TEST(StructuredOutput, InvalidGrammarsAreRefusedWithTheProblem) {
  nf::Model model = load();
  auto engine = nf::ServingEngine::create(model);
  ASSERT_TRUE(engine.ok()) << engine.message();
  const std::vector<int32_t> prompt = {1, 2, 3};
  struct Case {
    nf_grammar_kind kind;
    std::string grammar, says;
  } cases[] = {
      {NF_GRAMMAR_JSON_SCHEMA, "{\"type\": ", "invalid JSON schema"},
      {NF_GRAMMAR_JSON_SCHEMA, "{\"type\": \"no-such-type\"}",
       "invalid JSON schema"},
      {NF_GRAMMAR_REGEX, "(unclosed", "invalid regex"},
      {NF_GRAMMAR_EBNF, "root ::= missing_rule", "invalid grammar"},
      {NF_GRAMMAR_STRUCTURAL_TAG, "[]", "invalid structural tag"},
      // Not an enumerator, but within the enum's range (42 would be
      // undefined behaviour in C++ before it reached the engine).
      {static_cast<nf_grammar_kind>(7), "x", "not an nf_grammar_kind"},
  };
  for (const Case &c : cases) {
    nf_status code = NF_OK;
    auto r = engine->submit(request(prompt, c.kind, c.grammar, 4), &code);
    EXPECT_FALSE(r.ok()) << c.grammar;
    EXPECT_EQ(code, NF_ERR_INVALID_ARGUMENT) << c.grammar;
    EXPECT_NE(r.message().find(c.says), std::string::npos)
        << c.grammar << ": " << r.message();
    EXPECT_EQ(r.message().find('\n'), std::string::npos) << r.message();
  }
}

} // namespace
