// Embedding libnf: load a plan, encode a prompt and generate greedily,
// printing the text as it comes. Uses only the installed public headers.
//
//   embed PLAN [WEIGHTS_DIR] [PROMPT]
//
// Without a tokenizer next to the weights, the prompt is the BOS token (or
// token 1) and the output is token ids.
#include <nf/nf.hpp>

#include <cstdio>
#include <iostream>
#include <string>

int main(int argc, char **argv) {
  if (argc < 2 || argc > 4) {
    std::cerr << "usage: embed PLAN [WEIGHTS_DIR] [PROMPT]\n";
    return 2;
  }
  std::cout << "libnf " << nf_version() << "\n";

  nf::ModelParams params;
  if (argc > 2)
    params.weightsDir = argv[2];
  params.maxSequences = 1;
  auto model = nf::Model::load(argv[1], params);
  if (!model) {
    std::cerr << "embed: " << model.message() << "\n";
    return 1;
  }
  std::cout << model->info();

  std::vector<int32_t> prompt;
  if (model->hasTokenizer()) {
    std::string text = argc > 3 ? argv[3] : "The Python tutorial";
    auto ids = model->tokenize(text);
    if (!ids) {
      std::cerr << "embed: " << ids.message() << "\n";
      return 1;
    }
    prompt = *ids;
    std::cout << "prompt: " << text << "\n";
  } else {
    prompt = {model->bos() >= 0 ? model->bos() : 1};
    std::cout << "prompt: token " << prompt[0] << "\n";
  }

  nf::GenerateParams gen; // greedy
  gen.maxTokens = 24;
  std::cout << "output: ";
  auto tokens =
      model->generate(prompt, gen, [&](int32_t token, std::string_view piece) {
        if (model->hasTokenizer())
          std::cout << piece;
        else
          std::cout << token << " ";
        std::cout.flush();
        return true; // keep going
      });
  std::cout << "\n";
  if (!tokens) {
    std::cerr << "embed: " << tokens.message() << "\n";
    return 1;
  }
  std::cout << "generated " << tokens->size() << " tokens\n";
  return tokens->empty() ? 1 : 0;
}
