"""The study's corpora as text files, from public-domain sources you download (docs/minutes.md); none is committed.

    git clone --depth 1 https://github.com/chinese-poetry/chinese-poetry
    git clone --depth 1 https://github.com/GITenberg/War-and-Peace_2600             # Project Gutenberg's #2600
    git clone --depth 1 https://github.com/GITenberg/Pride-and-Prejudice_1342       # and #1342
    python runs/study_corpora.py --poetry chinese-poetry --war_and_peace War-and-Peace_2600/2600-0.txt \
        --pride Pride-and-Prejudice_1342/1342-0.txt --shakespeare data/shakespeare_char/input.txt --out corpora
    for c in shijing songshi songshi1m songci pride pride100k warpeace100k warpeace700k shakespeare100k; do
        python data/prepare.py --input corpora/$c.txt --out ds/$c; done
    python data/prepare.py --input corpora/warpeace.txt --out ds/warpeace_char
    python data/prepare.py --input corpora/warpeace.txt --tokenizer bpe --out ds/warpeace_bpe

--books FOLDER adds the second round's books and classical Chinese; --novels CHECKOUT (git clone --depth 1
https://github.com/tennessine/corpus) adds four vernacular Chinese novels and the first 300 KB of three of them
(sanguo300k, shuihu300k, xiyou300k), prepared the same way. --luxun CHECKOUT (git clone --depth 1
https://github.com/tallusil/luxun-novel-analysis) adds three texts of 鲁迅, held out from every fit: luxun_small,
luxun_fiction and luxun_essays. --ruslit CHECKOUT (git clone --depth 1 https://github.com/d0rj/RusLit) adds eleven
Russian novels in Cyrillic, held out from the law's fit: ru_pushkin, ru_turgenev and ru_gogol, five more that set
the factor on prose in two-byte letters with them, and three held out from it (RUSLIT below).

Writes shijing.txt (詩經, 115 KB), songshi.txt (the first 30 MB of the Song poems in 全唐诗/poet.song.*.json) and
songshi1m.txt (its first 1 MB), songci.txt (宋詞, 5.7 MB), warpeace.txt (3.3 MB), pride.txt (690 KB), and the first
100,000 bytes of three of them: pride100k.txt, warpeace100k.txt and shakespeare100k.txt (tiny Shakespeare), and
War and Peace's first 700,000 bytes, warpeace700k.txt (Pride and Prejudice's size, for the fit).
A poem is its title, its author where known, and its lines, a blank line between poems; a Gutenberg book is its
text between the START and END markers. From those sources (2026-12-03) the study's files came out byte for byte.
"""
import argparse
import json
import os
import re


def gutenberg(path, out, encoding="utf-8-sig"):
    with open(path, encoding=encoding) as f:
        text = f.read().replace("\r\n", "\n")
    start = text.find("\n", text.find("*** START OF")) + 1
    with open(out, "w", encoding="utf-8") as f:
        f.write(text[start:text.find("*** END OF")].strip() + "\n")


def head(path, size, out):
    """The first `size` bytes of path, less a character they would cut in two."""
    with open(path, "rb") as f, open(out, "wb") as g:
        g.write(f.read(size).decode("utf-8", "ignore").encode("utf-8"))


def poems(files, out, key="paragraphs", limit=None):
    """The poems of chinese-poetry's JSON files, in order, up to limit bytes."""
    parts, size = [], 0
    for path in files:
        with open(path, encoding="utf-8") as f:
            for poem in json.load(f):
                title = poem.get("title") or poem.get("rhythmic") or poem.get("chapter") or ""
                body = "\n".join(poem.get(key) or poem.get("content") or [])
                if not body:
                    continue
                text = "\n".join(x for x in (title, poem.get("author", ""), body) if x) + "\n"
                parts.append(text)
                size += len(text.encode("utf-8"))
                if limit and size >= limit:
                    break
        if limit and size >= limit:
            break
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))


def prose(path, out):
    """A classic's chapters (chinese-poetry's 论语 and 四书五经 JSON): each chapter's title, then its paragraphs."""
    with open(path, encoding="utf-8") as f:
        chapters = json.load(f)
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(c["chapter"] + "\n" + "\n".join(c["paragraphs"]) + "\n" for c in chapters))


def guwen(path, out):
    """古文觀止 (chinese-poetry's 蒙学/guwenguanzhi.json): each piece's title, source and paragraphs, in order."""
    with open(path, encoding="utf-8") as f:
        book = json.load(f)
    pieces = [p for volume in book["content"] for p in volume["content"]]
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(p["chapter"] + "\n" + p.get("source", "") + "\n" + "\n".join(p["paragraphs"]) + "\n"
                           for p in pieces))


# The books the law was fitted to beyond the first ones (docs/minutes.md): Project Gutenberg's file names
BOOKS = {"moby": ("2701-0.txt", "utf-8-sig"), "alice": ("11-0.txt", "utf-8-sig"),
         "frankenstein": ("84-0.txt", "utf-8-sig"), "sherlock": ("1661.txt", "utf-8-sig"),
         "twocities": ("98-0.txt", "utf-8-sig"), "quijote": ("2000-8.txt", "latin-1")}


# The vernacular novels (白話, simplified characters), from github.com/tennessine/corpus: the fifth round's Chinese
NOVELS = {"sanguo": "三国演义.txt", "shuihu": "水浒传.txt", "xiyou": "西游记.txt", "hongloumeng": "红楼梦.txt"}


def novel(path, out):
    """A novel as it is (tennessine/corpus, RusLit), its CRLF line ends made LF."""
    with open(path, encoding="utf-8") as f:
        text = f.read().replace("\r\n", "\n")
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)


# 鲁迅 (Lu Xun, 1881-1936; modern vernacular, essays and stories), from github.com/tallusil/luxun-novel-analysis's
# data/combined: held out from every fit, the sixth round's check of the plan on text unlike the novels
LUXUN = {"luxun_small": ("朝花夕拾", "野草"), "luxun_fiction": ("呐喊", "彷徨", "故事新编"),
         "luxun_essays": ("坟", "热风", "华盖集", "华盖集续编", "而已集", "三闲集", "二心集")}


# Russian prose (Cyrillic: two bytes a letter), from github.com/d0rj/RusLit's prose/: held out from the law's fit, the
# seventh round's check on a script the study never read; each book whole, its endnotes kept, as a user would give it
RUSLIT = {"ru_pushkin": "Pushkin/Капитанская дочка.txt", "ru_turgenev": "Turgenev/Отцы и дети.txt",
          "ru_gogol": "Gogol/Мёртвые души.txt",
          # five more that set plan.EASIER_LETTERS with the three above, then three held out from it (herzen,
          # bryusov, herzen2): docs/results.md, "Russian: eleven novels"
          "ru_lermontov": "Lermontov/Герой нашего времени.txt", "ru_chekhov": "Chekhov/Дуэль.txt",
          "ru_dostoevsky": "Dostoevsky/Игрок.txt", "ru_tolstoy": "Tolstoy/Хаджи-Мурат.txt",
          "ru_gorky": "Gorky/Мать.txt", "ru_herzen": "Herzen/Кто виноват.txt",
          "ru_bryusov": "Bryusov/Огненный ангел.txt", "ru_herzen2": "Herzen/Долг прежде всего.txt"}


def collections(folder, names, out):
    """The collections names/*.txt in folder joined as they are (hard-wrapped lines, the footnote marks kept)."""
    with open(out, "w", encoding="utf-8") as f:
        for name in names:
            with open(os.path.join(folder, f"{name}.txt"), encoding="utf-8") as g:
                f.write(g.read())


def numbered(folder, pattern):
    """folder's files matching pattern (one group: their number), in numeric order."""
    names = [n for n in os.listdir(folder) if re.fullmatch(pattern, n)]
    return [os.path.join(folder, n) for n in sorted(names, key=lambda n: int(re.fullmatch(pattern, n).group(1)))]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--poetry", required=True, help="a checkout of github.com/chinese-poetry/chinese-poetry")
    p.add_argument("--war_and_peace", required=True, help="Project Gutenberg's #2600, as text")
    p.add_argument("--pride", required=True, help="Project Gutenberg's #1342, as text")
    p.add_argument("--shakespeare", required=True, help="tiny Shakespeare (data/shakespeare_char/input.txt)")
    p.add_argument("--books", help="a folder of Project Gutenberg's files for the later fit corpora: " +
                   ", ".join(f"{f} ({n})" for n, (f, _) in BOOKS.items()))
    p.add_argument("--novels", help="a checkout of github.com/tennessine/corpus, for the vernacular novels: " +
                   ", ".join(f"{f} ({n})" for n, f in NOVELS.items()))
    p.add_argument("--luxun", help="a checkout of github.com/tallusil/luxun-novel-analysis, for 鲁迅: " +
                   "; ".join(f"{n} ({', '.join(c)})" for n, c in LUXUN.items()))
    p.add_argument("--ruslit", help="a checkout of github.com/d0rj/RusLit, for Russian novels: " +
                   ", ".join(f"{n} ({f})" for n, f in RUSLIT.items()))
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    out = lambda name: os.path.join(args.out, name)  # noqa: E731
    gutenberg(args.war_and_peace, out("warpeace.txt"))
    gutenberg(args.pride, out("pride.txt"))
    for source, size, name in ((out("pride.txt"), 100_000, "pride100k.txt"),
                               (out("warpeace.txt"), 100_000, "warpeace100k.txt"),
                               (out("warpeace.txt"), 700_000, "warpeace700k.txt"),
                               (args.shakespeare, 100_000, "shakespeare100k.txt")):
        head(source, size, out(name))
    poems(numbered(os.path.join(args.poetry, "全唐诗"), r"poet\.song\.(\d+)\.json"), out("songshi.txt"), limit=30_000_000)
    head(out("songshi.txt"), 1_000_000, out("songshi1m.txt"))
    poems(numbered(os.path.join(args.poetry, "宋词"), r"ci\.song\.(\d+)\.json"), out("songci.txt"))
    shijing = os.path.join(args.poetry, "诗经")
    poems([os.path.join(shijing, n) for n in sorted(os.listdir(shijing)) if n.endswith(".json")], out("shijing.txt"),
          key="content")
    if args.books:  # the second round of fit corpora: more books and classical Chinese prose, 60 KB to 1.2 MB
        for name, (file, encoding) in BOOKS.items():
            gutenberg(os.path.join(args.books, file), out(f"{name}.txt"), encoding)
        for name in ("moby", "frankenstein", "quijote"):
            head(out(f"{name}.txt"), 100_000, out(f"{name}100k.txt"))
        prose(os.path.join(args.poetry, "论语", "lunyu.json"), out("lunyu.txt"))
        prose(os.path.join(args.poetry, "四书五经", "mengzi.json"), out("mengzi.txt"))
        guwen(os.path.join(args.poetry, "蒙学", "guwenguanzhi.json"), out("guwen.txt"))
        poems([os.path.join(args.poetry, "元曲", "yuanqu.json")], out("yuanqu1m.txt"), limit=1_000_000)
    if args.novels:  # the fifth round: vernacular Chinese, whole and its first 300 KB (a text a few minutes use up)
        for name, file in NOVELS.items():
            novel(os.path.join(args.novels, file), out(f"{name}.txt"))
        for name in ("sanguo", "shuihu", "xiyou"):
            head(out(f"{name}.txt"), 300_000, out(f"{name}300k.txt"))
    if args.luxun:  # the sixth round: modern vernacular Chinese, 200 KB to 2 MB
        for name, names in LUXUN.items():
            collections(os.path.join(args.luxun, "data", "combined"), names, out(f"{name}.txt"))
    if args.ruslit:  # the seventh round and the eighth: Cyrillic, 229 KB to 1.4 MB
        for name, file in RUSLIT.items():
            novel(os.path.join(args.ruslit, "prose", file), out(f"{name}.txt"))
    for name in sorted(os.listdir(args.out)):
        print(f"{name}: {os.path.getsize(out(name)):,} bytes")


if __name__ == "__main__":
    main()
