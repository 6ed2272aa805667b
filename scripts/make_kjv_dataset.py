#!/usr/bin/env python3
"""Turn the King James Bible (OSIS XML) into a chat fine-tuning set (JSONL).

Usage: make_kjv_dataset.py KJV_OSIS_XML OUT.jsonl [--verses-per-example N]

The OSIS file ships with Debian's `bibledit-data` package as
/usr/share/bibledit/sources/kjv.xml (public domain text). Verses sit between milestones
<verse osisID="Gen.1.1" sID="Gen.1.1"/> ... <verse eID="Gen.1.1"/>, with <w>,
<transChange>, <divineName>, <q> etc. inside. Notes (<note>) and headings (<title>) are
dropped, markup is stripped, the text of <divineName> is written LORD as printed in the
KJV, and whitespace is collapsed.

Each output line is one example:
  {"messages": [{"role": "user", "content": "Recite Genesis 1:1-3 from the King James Bible."},
                {"role": "assistant", "content": "In the beginning God created ..."}]}
grouping N (default 3) consecutive verses of one chapter (the last group of a chapter
may be shorter). The prompt phrasing is chosen deterministically from the reference
(CRC-32), so reruns produce identical files. Standard library only.
"""
import argparse
import html
import json
import os
import re
import sys
import tempfile
import zlib

BOOKS = {
    "Gen": "Genesis", "Exod": "Exodus", "Lev": "Leviticus", "Num": "Numbers", "Deut": "Deuteronomy",
    "Josh": "Joshua", "Judg": "Judges", "Ruth": "Ruth", "1Sam": "1 Samuel", "2Sam": "2 Samuel",
    "1Kgs": "1 Kings", "2Kgs": "2 Kings", "1Chr": "1 Chronicles", "2Chr": "2 Chronicles", "Ezra": "Ezra",
    "Neh": "Nehemiah", "Esth": "Esther", "Job": "Job", "Ps": "Psalms", "Prov": "Proverbs",
    "Eccl": "Ecclesiastes", "Song": "Song of Solomon", "Isa": "Isaiah", "Jer": "Jeremiah",
    "Lam": "Lamentations", "Ezek": "Ezekiel", "Dan": "Daniel", "Hos": "Hosea", "Joel": "Joel",
    "Amos": "Amos", "Obad": "Obadiah", "Jonah": "Jonah", "Mic": "Micah", "Nah": "Nahum",
    "Hab": "Habakkuk", "Zeph": "Zephaniah", "Hag": "Haggai", "Zech": "Zechariah", "Mal": "Malachi",
    "Matt": "Matthew", "Mark": "Mark", "Luke": "Luke", "John": "John", "Acts": "Acts",
    "Rom": "Romans", "1Cor": "1 Corinthians", "2Cor": "2 Corinthians", "Gal": "Galatians",
    "Eph": "Ephesians", "Phil": "Philippians", "Col": "Colossians", "1Thess": "1 Thessalonians",
    "2Thess": "2 Thessalonians", "1Tim": "1 Timothy", "2Tim": "2 Timothy", "Titus": "Titus",
    "Phlm": "Philemon", "Heb": "Hebrews", "Jas": "James", "1Pet": "1 Peter", "2Pet": "2 Peter",
    "1John": "1 John", "2John": "2 John", "3John": "3 John", "Jude": "Jude", "Rev": "Revelation",
}

PROMPTS = [
    "Recite {ref} from the King James Bible.",
    "What does {ref} say in the King James Version?",
    "Quote {ref} (KJV).",
    "Please give me the text of {ref} in the King James Version.",
    "Write out {ref} as it reads in the KJV.",
]

VERSE_RE = re.compile(r'<verse\b[^>]*\bsID="([^"]+)"[^>]*/>(.*?)<verse\b[^>]*\beID="\1"[^>]*/>', re.S)
OSISID_RE = re.compile(r'\bosisID="([^"]+)"')
DROP_RE = re.compile(r"<note\b.*?</note>|<title\b.*?</title>", re.S)
DIVINE_RE = re.compile(r"<divineName>(.*?)</divineName>", re.S)
TAG_RE = re.compile(r"<[^>]+>")
WS_RE = re.compile(r"\s+")


def clean(fragment):
    s = DROP_RE.sub("", fragment)
    s = DIVINE_RE.sub(lambda m: TAG_RE.sub("", m.group(1)).upper(), s)
    s = TAG_RE.sub("", s)
    s = html.unescape(s)
    s = WS_RE.sub(" ", s).strip()
    return re.sub(r" ([,;:.?!)])", r"\1", s)


def read_verses(xml):
    """Yields (book, chapter, verse, text) in document order."""
    for m in VERSE_RE.finditer(xml):
        start_tag = xml[m.start():xml.index("/>", m.start()) + 2]
        osis = OSISID_RE.search(start_tag)
        ref = (osis.group(1) if osis else m.group(1)).split()[0]
        parts = ref.split(".")
        if len(parts) != 3 or parts[0] not in BOOKS:
            raise SystemExit(f"unexpected verse id {ref!r}")
        text = clean(m.group(2))
        if text:
            yield parts[0], int(parts[1]), int(parts[2]), text


def make_examples(verses, per_example):
    group = []

    def flush():
        book, chap = group[0][0], group[0][1]
        first, last = group[0][2], group[-1][2]
        name = "Psalm" if book == "Ps" else BOOKS[book]  # "Psalm 23:1", as usually cited
        ref = f"{name} {chap}:{first}" + (f"-{last}" if last != first else "")
        prompt = PROMPTS[zlib.crc32(ref.encode()) % len(PROMPTS)].format(ref=ref)
        answer = " ".join(v[3] for v in group)
        return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]}

    for v in verses:
        if group and (v[:2] != group[0][:2] or len(group) == per_example or v[2] != group[-1][2] + 1):
            yield flush()
            group = []
        group.append(v)
    if group:
        yield flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("osis_xml")
    ap.add_argument("out_jsonl")
    ap.add_argument("--verses-per-example", type=int, default=3)
    args = ap.parse_args()
    if args.verses_per_example < 1:
        ap.error("--verses-per-example must be >= 1")
    with open(args.osis_xml, encoding="utf-8") as f:
        xml = f.read()
    out_dir = os.path.dirname(os.path.abspath(args.out_jsonl))
    fd, tmp = tempfile.mkstemp(prefix=".kjv-", suffix=".jsonl.tmp", dir=out_dir)
    n = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for ex in make_examples(read_verses(xml), args.verses_per_example):
                out.write(json.dumps(ex, ensure_ascii=False) + "\n")
                n += 1
        if n == 0:
            raise SystemExit(f"{args.osis_xml}: no verses found (is it OSIS XML?)")
        # mkstemp makes the file 0600; the dataset is for every user, as a plain open() would
        # make it (0644 under the usual umask 022)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, args.out_jsonl)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    print(f"wrote {n} examples to {args.out_jsonl}")


if __name__ == "__main__":
    sys.exit(main())
