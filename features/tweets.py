"""Disaster Tweets: keyword, location and tweet text, normalised for a WordPiece vocabulary.

HTML entities are decoded (``&amp;`` -> ``&``), each link becomes the word ``url`` (Kaggle's links are
opaque t.co short links, so only their presence and count carry signal), each mention becomes ``@user``
(as BERTweet and TweetEval normalise them), hashtags stay as written, URL-encoded keywords are decoded
(``airplane%20accident``), mis-decoded bytes (``\x89Û_``) are dropped and whitespace is collapsed.
Per row, no fitting.
"""

from __future__ import annotations

import html
import re
from urllib.parse import unquote

import pandas as pd

URL = re.compile(r"https?://\S+|www\.\S+")
MENTION = re.compile(r"@\w+")
MOJIBAKE = re.compile(r"[\x80-\x9f]|Û\S?|Ê|Ï|Ò|Ó|å_|åÊ|Ì©")


def normalise_tweet(text: object) -> object:
    if not isinstance(text, str):
        return text
    text = html.unescape(html.unescape(text))  # some tweets are double-escaped: &amp;amp;
    text = URL.sub(" url ", text)
    text = MENTION.sub(" @user ", text)
    text = MOJIBAKE.sub(" ", text)
    return re.sub(r"\s+", " ", text).strip()


def normalise_keyword(keyword: object) -> object:
    return unquote(keyword).strip() if isinstance(keyword, str) else keyword


def add_features(rows: pd.DataFrame) -> pd.DataFrame:
    rows = rows.copy()
    rows["keyword"] = rows["keyword"].map(normalise_keyword)
    rows["location"] = rows["location"].map(normalise_tweet)
    rows["text"] = rows["text"].map(normalise_tweet)
    return rows
