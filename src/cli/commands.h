/* commands.h — every `moonshine SUBCOMMAND`. Each returns the process exit
 * code (0 ok, 1 failure, 2 usage error) and may print; nothing else may. */
#ifndef MS_COMMANDS_H
#define MS_COMMANDS_H

typedef int (*ms_cmd_fn)(int argc, char **argv);

/* name (an underscore is typed as '-': bench_batch is `moonshine bench-batch`), function, one-line help */
#define MS_COMMAND_LIST(X) \
    X(inspect, "list a checkpoint's tensors (name, dtype, shape, file)") \
    X(verify, "check the engine against a fixture's reference logits") \
    X(run, "generate greedily from prompt ids") \
    X(synth, "write a random-weight checkpoint from a config") \
    X(plan, "memory ledger for a model, context and budget") \
    X(bench, "measure load, prefill and decode speed and bandwidth use (JSON)") \
    X(bench_batch, "aggregate decode speed of K sequences stepped together, K = 1, 2, 4, 8 (JSON)") \
    X(kbench, "CPU kernel microbenchmark: bandwidth, decode GB/s, prefill GFLOP/s") \
    X(bench_grammar, "time the constrained-decoding token mask on real vocabularies (JSON)") \
    X(kdabench, "time the chunked KDA delta rule against token-by-token stepping (JSON)") \
    X(pack, "rewrite routed experts into a packed, checksummed expert store") \
    X(probe, "measure a file's sequential read bandwidth (the drive's floor)") \
    X(render, "render a chat request (stdin JSON) with the model's chat template") \
    X(tokenize, "encode stdin text to token ids (JSON array) with a model's tokenizer") \
    X(detokenize, "decode a JSON array of token ids from stdin to text") \
    X(parse, "split generated text (stdin) into content, reasoning and tool calls (JSON)") \
    X(state, "inspect a saved causal-state file (header as JSON)") \
    X(cachesim, "replay a recorded expert trace through the cache policies (JSON)") \
    X(serve, "OpenAI-compatible HTTP server (also installed as moonshine-server)") \
    X(chat, "interactive chat in the terminal (also installed as moonshine-chat)") \
    /* one line per command, each ending in a backslash; keep this comment last */

#define MS_DECLARE(name, help) int cmd_##name(int argc, char **argv);
MS_COMMAND_LIST(MS_DECLARE)
#undef MS_DECLARE

#endif
