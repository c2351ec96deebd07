// nf-chat-render: renders chat templates with nf's Jinja renderer, for the
// comparison with Python's jinja2 (test/lit/chat/Inputs/check_render.py).
//
//   nf-chat-render CASES.json
//
// CASES.json: a list of {"template": <Jinja source>, "context": {<template
// variables>}}. Prints a JSON list with one {"output": <text>} or
// {"error": <message>} per case, in order (a template that does not parse is
// an error of each case that uses it). Exit status 1 only for unusable input.
#include "chat/chat_template.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>
#include <sstream>

int main(int argc, char **argv) {
  using ojson = nlohmann::ordered_json;
  if (argc != 2) {
    std::cerr << "usage: nf-chat-render CASES.json\n";
    return 1;
  }
  std::ifstream in(argv[1], std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  ojson cases = ojson::parse(text.str(), nullptr, false);
  if (!in || cases.is_discarded() || !cases.is_array()) {
    std::cerr << "nf-chat-render: " << argv[1] << ": not a JSON list\n";
    return 1;
  }
  ojson results = ojson::array();
  for (const ojson &c : cases) {
    const std::string name = c.value("name", "case");
    auto tmpl = nf::chat::ChatTemplate::parse(c.value("template", ""), name);
    if (!tmpl) {
      results.push_back({{"error", tmpl.message()}});
      continue;
    }
    auto out = tmpl->render(c.value("context", ojson::object()));
    if (out)
      results.push_back({{"output", *out}});
    else
      results.push_back({{"error", out.message()}});
  }
  std::cout << results.dump(1, ' ', false, ojson::error_handler_t::replace)
            << "\n";
  return 0;
}
