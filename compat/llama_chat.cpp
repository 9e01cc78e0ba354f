// llama_chat: llama.cpp's own chat templating and output parsing, as llama-server drives them, over JSON lines.
//   llama_chat MODEL.gguf < requests.jsonl > results.jsonl
// Each request: {"messages": [...], "tools": [...]?, "tool_choice": "auto"?, "enable_thinking": bool?,
//   "add_generation_prompt": bool?, "reasoning_format": "auto"|"none"|...?, "parallel_tool_calls": bool?,
//   "outputs": [{"text": "...", "is_partial": bool}]?}
// Each result: {"prompt", "format", "generation_prompt", "parsed": [oaicompat message per output]} or {"error"}.
// The model is loaded vocab-only: only its chat template and tokens matter here.
#include "chat.h"
#include "common.h"
#include "llama.h"

#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

using json = nlohmann::ordered_json;

// Current llama.cpp (0c1e570) takes and returns its own common_json (common/json.h) where b8462 used nlohmann's;
// the values cross over as JSON text, which both read and write the same way.
#if __has_include("json.h")
#include "json.h"
static common_json theirs(const json & v) { return common_json::parse(v.dump()); }
static json ours(const common_json & v) { return json::parse(v.dump()); }
#else
static const json & theirs(const json & v) { return v; }
static json ours(const json & v) { return v; }
#endif

static json run(const common_chat_templates * tmpls, const json & req) {
    common_chat_templates_inputs in;
    in.messages = common_chat_msgs_parse_oaicompat(theirs(req.at("messages")));
    in.tools = common_chat_tools_parse_oaicompat(theirs(req.value("tools", json::array())));
    in.tool_choice = common_chat_tool_choice_parse_oaicompat(req.value("tool_choice", std::string("auto")));
    in.parallel_tool_calls = req.value("parallel_tool_calls", false);
    in.add_generation_prompt = req.value("add_generation_prompt", true);
    in.enable_thinking = req.value("enable_thinking", true);
    in.use_jinja = true;
    // llama-server's default --reasoning-format is auto, which parses like deepseek.
    in.reasoning_format = common_reasoning_format_from_name(req.value("reasoning_format", std::string("auto")));
    const common_chat_params cp = common_chat_templates_apply(tmpls, in);

    common_chat_parser_params pp(cp);
    pp.reasoning_format = in.reasoning_format;
    pp.parse_tool_calls = !in.tools.empty() && in.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE;
    if (!cp.parser.empty()) pp.parser.load(cp.parser);

    json parsed = json::array();
    for (const auto & out : req.value("outputs", json::array())) {
        common_chat_msg msg = common_chat_parse(out.at("text").get<std::string>(), out.value("is_partial", false), pp);
        parsed.push_back(ours(msg.to_json_oaicompat()));
    }
    return {{"prompt", cp.prompt}, {"format", common_chat_format_name(cp.format)},
            {"generation_prompt", cp.generation_prompt}, {"parsed", parsed}};
}

int main(int argc, char ** argv) {
    if (argc != 2) { std::cerr << "usage: llama_chat MODEL.gguf < requests.jsonl\n"; return 1; }
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { std::cerr << "llama_chat: cannot load model\n"; return 1; }
    common_chat_templates_ptr tmpls = common_chat_templates_init(model, "");
    std::string line;
    while (std::getline(std::cin, line)) {
        if (line.empty()) continue;
        json result;
        try {
            result = run(tmpls.get(), json::parse(line));
        } catch (const std::exception & e) {
            result = {{"error", e.what()}};
        }
        std::cout << result.dump() << "\n" << std::flush;
    }
    llama_model_free(model);
    return 0;
}
