// llama_logits: evaluate a token sequence with llama.cpp (the oracle) and dump what the goldens need.
//   llama_logits MODEL.gguf IDS_FILE OUT_PREFIX [--kv f32|f16] [--fa on|off] [--greedy N]
// IDS_FILE holds whitespace-separated token ids. Writes OUT_PREFIX.logits (float32 [n_tokens, n_vocab],
// logits of every prompt position from one batched prefill) and OUT_PREFIX.greedy (N greedy token ids, one
// decode step at a time after the prompt). Built against the compat llama.cpp tree by compat/build_llamacpp.sh.
#define ORACLE_TOOL "llama_logits"
#include "oracle_common.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 4) return fail("usage: llama_logits MODEL IDS_FILE OUT_PREFIX [--kv f32|f16] [--fa on|off] [--greedy N]");
    std::string kv = "f16", fa = "off";
    int n_greedy = 0;
    for (int i = 4; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--kv")) kv = argv[i + 1];
        else if (!strcmp(argv[i], "--fa")) fa = argv[i + 1];
        else if (!strcmp(argv[i], "--greedy")) n_greedy = atoi(argv[i + 1]);
        else return fail("unknown option");
    }
    std::vector<llama_token> ids;
    { std::ifstream in(argv[2]); long t; while (in >> t) ids.push_back((llama_token) t); }
    if (ids.empty()) return fail("no token ids");

    llama_model * model = load_model_cpu(argv[1]);
    if (!model) return fail("cannot load model");
    llama_context_params cp = cpu_context_params((uint32_t) (ids.size() + n_greedy + 8), (uint32_t) ids.size(), kv,
                                                 fa == "on");
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) return fail("cannot create context");
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    // Prefill with logits for every position.
    llama_batch batch = llama_batch_init((int32_t) ids.size(), 0, 1);
    for (size_t i = 0; i < ids.size(); i++) {
        batch.token[i] = ids[i]; batch.pos[i] = (llama_pos) i; batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0; batch.logits[i] = 1;
    }
    batch.n_tokens = (int32_t) ids.size();
    if (llama_decode(ctx, batch)) return fail("prefill failed");
    std::string prefix = argv[3];
    FILE * f = fopen((prefix + ".logits").c_str(), "wb");
    for (size_t i = 0; i < ids.size(); i++) fwrite(llama_get_logits_ith(ctx, (int32_t) i), sizeof(float), n_vocab, f);
    fclose(f);

    // Greedy continuation, one token per decode call.
    FILE * g = fopen((prefix + ".greedy").c_str(), "w");
    llama_token tok = argmax(llama_get_logits_ith(ctx, (int32_t) ids.size() - 1), n_vocab);
    for (int i = 0; i < n_greedy; i++) {
        fprintf(g, "%d\n", tok);
        llama_batch one = llama_batch_get_one(&tok, 1);
        if (llama_decode(ctx, one)) return fail("decode failed");
        tok = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
    }
    fclose(g);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
