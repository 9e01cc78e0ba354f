// llama_mtmd: run llama.cpp's mtmd (the oracle) on one image + prompt and dump what the vision goldens need.
//   llama_mtmd MODEL.gguf MMPROJ.gguf IMAGE PROMPT_FILE OUT_PREFIX [--greedy N] [--clip-fa on|off] [--kv f32|f16]
// PROMPT_FILE holds the prompt text with one "<__media__>" marker where the image goes (special tokens parsed,
// no BOS added). Writes
//   OUT_PREFIX.chunks  one line per chunk: "text ID ID ..." or "image NX NY N_TOKENS N_POS"; last line "n_past N"
//   OUT_PREFIX.embd    float32 [N_TOKENS, n_embd]: the image chunk's embeddings (mtmd_encode_chunk)
//   OUT_PREFIX.logits  float32 [n_vocab]: logits after the whole prompt (mtmd_helper_eval_chunks)
//   OUT_PREFIX.greedy  N greedy token ids, one decode step at a time after the prompt
// Built against the compat llama.cpp tree by compat/build_oracle_tools.sh.
#define ORACLE_TOOL "llama_mtmd"
#include "oracle_common.h"
#include "mtmd.h"
#include "mtmd-helper.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 6) return fail("usage: llama_mtmd MODEL MMPROJ IMAGE PROMPT_FILE OUT_PREFIX [--greedy N] "
                              "[--clip-fa on|off] [--kv f32|f16]");
    std::string kv = "f32", clip_fa = "off";
    int n_greedy = 0;
    for (int i = 6; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--kv")) kv = argv[i + 1];
        else if (!strcmp(argv[i], "--clip-fa")) clip_fa = argv[i + 1];
        else if (!strcmp(argv[i], "--greedy")) n_greedy = atoi(argv[i + 1]);
        else return fail("unknown option");
    }
    std::string prompt;
    { std::ifstream in(argv[4]); std::stringstream ss; ss << in.rdbuf(); prompt = ss.str(); }

    llama_model * model = load_model_cpu(argv[1]);
    if (!model) return fail("cannot load model");
    llama_context_params cp = cpu_context_params(8192, 4096, kv, false);
    llama_context * lctx = llama_init_from_model(model, cp);
    if (!lctx) return fail("cannot create context");
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    const int n_embd = llama_model_n_embd(model);

    mtmd_context_params mparams = mtmd_context_params_default();
    mparams.use_gpu = false;
    mparams.print_timings = false;
    mparams.n_threads = 2;
    mparams.warmup = false;
    mparams.flash_attn_type = clip_fa == "on" ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    mtmd_context * mctx = mtmd_init_from_file(argv[2], model, mparams);
    if (!mctx) return fail("cannot load mmproj");
    mtmd_bitmap * bmp = mtmd_helper_bitmap_init_from_file(mctx, argv[3]);
    if (!bmp) return fail("cannot load image");

    mtmd_input_text text;
    text.text = prompt.c_str();
    text.add_special = false;
    text.parse_special = true;
    mtmd_input_chunks * chunks = mtmd_input_chunks_init();
    const mtmd_bitmap * bitmaps[1] = {bmp};
    if (mtmd_tokenize(mctx, chunks, &text, bitmaps, 1) != 0) return fail("mtmd_tokenize failed");

    std::string prefix = argv[5];
    FILE * fc = fopen((prefix + ".chunks").c_str(), "w");
    for (size_t i = 0; i < mtmd_input_chunks_size(chunks); i++) {
        const mtmd_input_chunk * ch = mtmd_input_chunks_get(chunks, i);
        if (mtmd_input_chunk_get_type(ch) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
            size_t n = 0;
            const llama_token * toks = mtmd_input_chunk_get_tokens_text(ch, &n);
            fprintf(fc, "text");
            for (size_t j = 0; j < n; j++) fprintf(fc, " %d", toks[j]);
            fprintf(fc, "\n");
        } else {
            const mtmd_image_tokens * it = mtmd_input_chunk_get_tokens_image(ch);
            fprintf(fc, "image %zu %zu %zu %d\n", mtmd_image_tokens_get_nx(it), mtmd_image_tokens_get_ny(it),
                    mtmd_input_chunk_get_n_tokens(ch), (int) mtmd_input_chunk_get_n_pos(ch));
            if (mtmd_encode_chunk(mctx, ch) != 0) return fail("mtmd_encode_chunk failed");
            FILE * fe = fopen((prefix + ".embd").c_str(), "wb");
            fwrite(mtmd_get_output_embd(mctx), sizeof(float), (size_t) n_embd * mtmd_input_chunk_get_n_tokens(ch), fe);
            fclose(fe);
        }
    }

    llama_pos n_past = 0;
    if (mtmd_helper_eval_chunks(mctx, lctx, chunks, 0, 0, (int32_t) cp.n_batch, true, &n_past) != 0)
        return fail("mtmd_helper_eval_chunks failed");
    fprintf(fc, "n_past %d\n", (int) n_past);
    fclose(fc);
    FILE * fl = fopen((prefix + ".logits").c_str(), "wb");
    fwrite(llama_get_logits_ith(lctx, -1), sizeof(float), n_vocab, fl);
    fclose(fl);

    FILE * g = fopen((prefix + ".greedy").c_str(), "w");
    llama_token tok = argmax(llama_get_logits_ith(lctx, -1), n_vocab);
    llama_batch one = llama_batch_init(1, 0, 1);
    for (int i = 0; i < n_greedy; i++) {
        fprintf(g, "%d\n", tok);
        one.n_tokens = 1; one.token[0] = tok; one.pos[0] = n_past++; one.n_seq_id[0] = 1;
        one.seq_id[0][0] = 0; one.logits[0] = 1;
        if (llama_decode(lctx, one)) return fail("decode failed");
        tok = argmax(llama_get_logits_ith(lctx, -1), n_vocab);
    }
    fclose(g);
    llama_batch_free(one);
    mtmd_input_chunks_free(chunks);
    mtmd_bitmap_free(bmp);
    mtmd_free(mctx);
    llama_free(lctx);
    llama_model_free(model);
    return 0;
}
