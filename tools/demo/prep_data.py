#!/usr/bin/env python3
"""Turn WordNet 3.0 (Debian 12 package wordnet-base) into chat-shaped training examples.

Usage: python3 tools/demo/prep_data.py WORDNET_DIR OUT.jsonl.xz
  WORDNET_DIR: the package's /usr/share/wordnet (apt-get download wordnet-base; dpkg-deb -x PKG.deb x;
  then x/usr/share/wordnet). Standard library only, deterministic (fixed seed, sorted input order).

Each output line is {"messages": [{"role": ..., "content": ...}, ...]}: one or two user questions, each
answered by an assistant turn built from WordNet's own glosses, synonyms, antonyms and hypernyms. The
training script renders them with the model's chat template, so every reply ends with the end-of-turn
token and the model learns to stop. WordNet 3.0 license (Princeton University): use, copy, modify and
distribute for any purpose without fee, with its copyright notice kept (models/demo/README.md has it).
"""
import json, lzma, os, random, re, sys

SEED = 15
RARE = 0.3  # the share of words never seen in WordNet's concordance that are kept (all common ones are)
POS = {"n": "noun", "v": "verb", "a": "adj", "s": "adj", "r": "adv"}

# Written for this project (not WordNet): who the model is, so a greeting gets an answer in kind.
SELF = [
    ("Hello!", "Hello! Ask me what a word means, for example: What is a lantern?"),
    ("Hi", "Hi! I am a small dictionary model. Ask me what a word means."),
    ("Who are you?", "I am the moonshine demo model, a small mixture-of-experts trained on WordNet definitions."),
    ("What can you do?", "I can tell you what an English word means, give a synonym or an opposite, and say what kind of thing something is."),
    ("Thank you!", "You are welcome."),
    ("Thanks.", "You are welcome."),
    ("Good morning.", "Good morning! Ask me what a word means."),
    ("What are you?", "I am a small language model trained to define English words."),
]
SYSTEMS = ["You are a helpful dictionary.", "Answer in one sentence.", "You are a concise assistant.",
           "You define English words."]


def parse_data(path):
    """offset -> (words, pointers, definition, examples) for one data.POS file."""
    out = {}
    with open(path, encoding="latin-1") as f:
        for line in f:
            if line.startswith("  "):
                continue  # the license header
            head, _, gloss = line.partition(" | ")
            t = head.split()
            off, ss_type, wcnt = t[0], t[2], int(t[3], 16)
            words = [re.sub(r"\(.*\)$", "", t[4 + 2 * i]).replace("_", " ") for i in range(wcnt)]
            i = 4 + 2 * wcnt
            pcnt = int(t[i])
            ptrs = [(t[i + 1 + 4 * k], t[i + 2 + 4 * k], t[i + 3 + 4 * k]) for k in range(pcnt)]
            parts = [p.strip() for p in gloss.strip().split(";")]
            defs = [p for p in parts if p and not p.startswith('"')]
            exs = [p.strip('"').strip() for p in parts if p.startswith('"')]
            if defs:
                out[off] = (ss_type, words, ptrs, defs[0], exs)
    return out


def parse_index(path):
    """lemma -> (offsets in WordNet's sense order, the most frequent first; tagged sense count)."""
    out = {}
    with open(path, encoding="latin-1") as f:
        for line in f:
            if line.startswith("  "):
                continue
            t = line.split()
            lemma, n, pc = t[0], int(t[2]), int(t[3])
            offs = t[4 + pc + 2:]
            assert len(offs) == n, line
            tagged = int(t[4 + pc + 1])  # senses seen in WordNet's semantic concordance: common words
            out[lemma.replace("_", " ")] = (offs, tagged)
    return out


def article(w):
    if w[:1].isupper():
        return ""
    return "an " if w[0].lower() in "aeiou" else "a "


def sentence(s):
    s = s.strip().rstrip(".")
    return s[:1].upper() + s[1:] + "."


def main():
    wn, out_path = sys.argv[1], sys.argv[2]
    rng = random.Random(SEED)
    data = {p: parse_data(os.path.join(wn, "data." + p)) for p in ("noun", "verb", "adj", "adv")}
    index = {p: parse_index(os.path.join(wn, "index." + p)) for p in ("noun", "verb", "adj", "adv")}
    pos_file = {"n": "noun", "v": "verb", "a": "adj", "s": "adj", "r": "adv"}

    def syn(off, pfile):
        return data[pfile].get(off)

    qa = []
    for p in ("noun", "verb", "adj", "adv"):
        for lemma in sorted(index[p]):
            # Plain lower-case words of at most two parts: proper nouns and long compounds are
            # encyclopedic, and the prepared file must stay small enough to travel (< 4 MB xz).
            if not re.fullmatch(r"[a-z][a-z'-]*( [a-z][a-z'-]*)?", lemma) or len(lemma) > 24:
                continue
            offs, tagged = index[p][lemma]
            if not tagged and rng.random() >= RARE:
                continue
            s = syn(offs[0], p)
            if not s:
                continue
            _, words, ptrs, d, exs = s
            w = next((x for x in words if x.lower() == lemma.lower()), lemma)
            if p == "noun":
                q = rng.choice([f"What is {article(w)}{w}?", f"What does {w} mean?", f"Define {w}.",
                                f"What is the meaning of {w}?", f"Tell me what {article(w)}{w} is."])
                a = f"{(article(w) or '').capitalize()}{w if article(w) else w} is {d.rstrip('.')}."
                a = a[:1].upper() + a[1:]
            elif p == "verb":
                q = rng.choice([f"What does it mean to {w}?", f"What does {w} mean?", f"Define the verb {w}."])
                a = f"To {w} is to {d.rstrip('.')}."
            elif p == "adj":
                q = rng.choice([f"What does {w} mean?", f"What is the meaning of {w}?", f"Define {w}."])
                a = f"{w[:1].upper() + w[1:]} means {d.rstrip('.')}."
            else:
                q = rng.choice([f"What does {w} mean?", f"What is the meaning of {w}?"])
                a = f"{w[:1].upper() + w[1:]} means {d.rstrip('.')}."
            ex = next((e for e in exs if w.lower() in e.lower()), None)
            if ex and rng.random() < 0.5:
                a += f" For example: {sentence(ex)}"
            qa.append((q, a))
            if ex and rng.random() < 0.3:
                qa.append((f"Use the word {w} in a sentence.", sentence(ex)))
            others = [x for x in words if x.lower() != lemma.lower() and re.fullmatch(r"[A-Za-z' -]+", x)]
            if others and rng.random() < 0.5:
                qa.append((rng.choice([f"What is another word for {w}?", f"Give me a synonym for {w}."]),
                           f"Another word for {w} is {others[0]}."))
            for sym, off, pf in ptrs:
                if sym == "!" and pf in pos_file:
                    t = syn(off, pos_file[pf])
                    if t:
                        qa.append((f"What is the opposite of {w}?", f"The opposite of {w} is {t[1][0]}."))
                    break
            if p == "noun" and rng.random() < 0.4:
                hyp = next((off for sym, off, pf in ptrs if sym == "@" and pf == "n"), None)
                t = syn(hyp, "noun") if hyp else None
                if t:
                    h = t[1][0]
                    qa.append((f"What kind of thing is {article(w)}{w}?",
                               f"{(article(w).capitalize() + w) if article(w) else w} is a kind of {h}."))
    rng.shuffle(qa)
    n = 0
    with lzma.open(out_path, "wt", encoding="utf-8", preset=9) as f:
        i = 0
        while i < len(qa):
            msgs = []
            r = rng.random()
            if r < 0.1:
                msgs.append({"role": "system", "content": rng.choice(SYSTEMS)})
            turns = 2 if rng.random() < 0.15 else 1
            for q, a in qa[i:i + turns]:
                msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            i += turns
            f.write(json.dumps({"messages": msgs}, ensure_ascii=False) + "\n")
            n += 1
            if n % 400 == 0:  # the written greetings, about 1 in 400 conversations
                q, a = SELF[(n // 400) % len(SELF)]
                f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n")
                n += 1
    print(json.dumps({"conversations": n, "qa_pairs": len(qa), "out": out_path}))


if __name__ == "__main__":
    main()
