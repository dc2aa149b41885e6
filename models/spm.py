"""DeBERTa-v2/v3 tokenizers from a checkpoint's SentencePiece ``spm.model``, as a fast ``tokenizers.Tokenizer``.

``convert_spm`` builds what transformers' ``DebertaV2Converter`` builds, reading ``spm.model`` with protobuf (no
sentencepiece or transformers at run time). ``normalization="sentencepiece"`` (the default) keeps the model's own
NFKC table, as DeBERTa was pretrained (and as transformers 4 and from 5.25.0 on tokenize); ``"transformers"`` gives
the ids of transformers 5 before 5.25.0, which normalised with NFC instead. ``load_spm_tokenizer``
caches the conversion beside the model as ``kbert-tokenizer-<key>.json``.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import Unigram

from kbert.errors import KbertError
from kbert.io import file_sha256, read_json, write_text
from kbert.models.tokenizer import read_tokenizer

CONVERTER_VERSION = "deberta-v2-spm-v1"  # bump when the conversion changes, to invalidate the cached files
CACHE_PREFIX = "kbert-tokenizer-"
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
DEFAULT_SPECIAL_TOKENS = {"bos_token": "[CLS]", "eos_token": "[SEP]", "unk_token": "[UNK]", "sep_token": "[SEP]",
                          "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]"}  # DebertaV2Tokenizer's
UNIGRAM, CONTROL, USER_DEFINED = 1, 3, 4  # sentencepiece's TrainerSpec.ModelType and SentencePiece.Type values
SPIECE_UNDERLINE = "▁"
NORMALIZATIONS = ("sentencepiece", "transformers")  # the model's own table | transformers 5.0-5.24's NFC


@lru_cache(maxsize=1)
def model_proto_class() -> type:
    """A protobuf message class for sentencepiece's ``ModelProto`` (sentencepiece_model.proto), with only the fields
    read here; the others are kept as unknown fields. Defaults are the .proto's (a piece is NORMAL, the model
    UNIGRAM, when the field is absent)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    optional, repeated = field.LABEL_OPTIONAL, field.LABEL_REPEATED
    schema = descriptor_pb2.FileDescriptorProto(name="kbert/sentencepiece_model_subset.proto", package="kbert_spm",
                                                syntax="proto2")

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        proto = schema.message_type.add(name=name)
        for field_name, number, kind, label, default_or_type in fields:
            added = proto.field.add(name=field_name, number=number, type=kind, label=label)
            if kind == field.TYPE_MESSAGE:
                added.type_name = f".kbert_spm.{default_or_type}"
            elif default_or_type:
                added.default_value = default_or_type

    message("SentencePiece", ("piece", 1, field.TYPE_STRING, optional, ""),
            ("score", 2, field.TYPE_FLOAT, optional, ""),
            ("type", 3, field.TYPE_INT32, optional, "1"))  # an enum on the wire is a varint, as int32 is
    message("TrainerSpec", ("model_type", 3, field.TYPE_INT32, optional, "1"),
            ("unk_id", 40, field.TYPE_INT32, optional, "0"))
    message("NormalizerSpec", ("name", 1, field.TYPE_STRING, optional, ""),
            ("precompiled_charsmap", 2, field.TYPE_BYTES, optional, ""))
    message("ModelProto", ("pieces", 1, field.TYPE_MESSAGE, repeated, "SentencePiece"),
            ("trainer_spec", 2, field.TYPE_MESSAGE, optional, "TrainerSpec"),
            ("normalizer_spec", 3, field.TYPE_MESSAGE, optional, "NormalizerSpec"))
    pool = descriptor_pool.DescriptorPool()  # its own pool: no clash with sentencepiece's module when both load
    pool.Add(schema)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("kbert_spm.ModelProto"))


def read_spm_model(path: Path) -> Any:
    """The parsed ``ModelProto`` of a unigram sentencepiece file; anything else is one error naming the file."""
    path = Path(path)
    if not path.is_file():
        raise KbertError(f"{path}: file not found")
    proto = model_proto_class()()
    try:
        proto.ParseFromString(path.read_bytes())
    except Exception as exc:  # google.protobuf.message.DecodeError, or whatever a damaged file makes it raise
        raise KbertError(f"{path}: not a readable SentencePiece model (truncated or corrupt?): {exc}") from None
    if not proto.pieces:
        raise KbertError(f"{path}: not a SentencePiece model (no pieces; empty, truncated or another kind of file?)")
    if proto.trainer_spec.model_type != UNIGRAM:
        raise KbertError(f"{path}: a SentencePiece model of type {proto.trainer_spec.model_type}, not unigram (1); "
                         f"only DeBERTa-v2/v3-style unigram models are converted")
    if not 0 <= proto.trainer_spec.unk_id < len(proto.pieces):
        raise KbertError(f"{path}: unknown-piece id {proto.trainer_spec.unk_id} outside its {len(proto.pieces)} pieces")
    return proto


def _token(value: Any, where: Path | str, special: bool) -> dict[str, Any]:
    """A token setting (a string, or transformers' serialised AddedToken) as AddedToken arguments."""
    if isinstance(value, str):
        return {"content": value, "single_word": False, "lstrip": False, "rstrip": False, "normalized": not special,
                "special": special}
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return {"content": value["content"], "single_word": bool(value.get("single_word", False)),
                "lstrip": bool(value.get("lstrip", False)), "rstrip": bool(value.get("rstrip", False)),
                "normalized": bool(value.get("normalized", not special)),
                "special": bool(value.get("special", special))}
    raise KbertError(f"{where}: a token must be a string or an object with a 'content' string, found {value!r}")


def read_settings(folder: Path) -> dict[str, Any]:
    """The tokenizer settings of a checkpoint folder, from ``tokenizer_config.json``, ``special_tokens_map.json``
    (which wins, as in transformers) and ``added_tokens.json``, with DeBERTa's defaults; JSON-serialisable."""
    folder = Path(folder)
    config_path, map_path, added_path = (folder / "tokenizer_config.json", folder / "special_tokens_map.json",
                                         folder / "added_tokens.json")
    config = read_json(config_path) if config_path.is_file() else {}
    special_map = read_json(map_path) if map_path.is_file() else {}
    specials: dict[str, Any] = {}
    for key in SPECIAL_TOKEN_KEYS:
        for source, path in ((special_map, map_path), (config, config_path), (DEFAULT_SPECIAL_TOKENS, "defaults")):
            if source.get(key) is not None:
                specials[key] = _token(source[key], path, special=True)
                break
    additional = special_map.get("additional_special_tokens", config.get("additional_special_tokens")) or []
    if not isinstance(additional, list):
        raise KbertError(f"{map_path if 'additional_special_tokens' in special_map else config_path}: "
                         f"'additional_special_tokens' must be a list")
    additional_tokens = [_token(value, map_path, special=True) for value in additional]
    special_contents = {t["content"] for t in [*specials.values(), *additional_tokens]}

    added: dict[int, dict[str, Any]] = {}
    if added_path.is_file():
        for content, index in read_json(added_path).items():
            if not isinstance(index, int) or isinstance(index, bool):
                raise KbertError(f"{added_path}: the id of {content!r} must be an integer, found {index!r}")
            added[index] = _token(content, added_path, special=content in special_contents)
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        raise KbertError(f"{config_path}: 'added_tokens_decoder' must map ids to tokens")
    for index, value in decoder.items():
        try:
            index = int(index)
        except ValueError:
            raise KbertError(f"{config_path}: 'added_tokens_decoder' key {index!r} is not an id") from None
        added[index] = _token(value, config_path, special=True)

    for key in ("do_lower_case", "split_by_punct"):
        if not isinstance(config.get(key, False), bool):
            raise KbertError(f"{config_path}: '{key}' must be true or false, found {config[key]!r}")
    return {"do_lower_case": config.get("do_lower_case", False), "split_by_punct": config.get("split_by_punct", False),
            "special_tokens": specials, "additional_special_tokens": additional_tokens,
            "added_tokens": [[index, added[index]] for index in sorted(added)]}


def normalizer_steps(proto: Any, lowercase: bool, normalization: str) -> list[normalizers.Normalizer]:
    """The normaliser: ``DebertaV2Converter``'s (the model's own charsmap, which ``DebertaV2Tokenizer`` uses too from
    transformers 5.25) or transformers 5.0-5.24's ``DebertaV2Tokenizer``'s (NFC, whitespace runs, tabs and newlines
    made one space, trailing spaces stripped)."""
    steps = [normalizers.Lowercase()] if lowercase else []
    if normalization == "transformers":
        return [*steps, normalizers.Replace(Regex(r"\s{2,}|[\n\r\t]"), " "), normalizers.NFC(),
                normalizers.Strip(left=False, right=True)]
    steps.append(normalizers.Strip())
    if proto.normalizer_spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
    return [*steps, normalizers.Replace(Regex(" {2,}"), " ")]


def convert_spm(model_path: Path, settings: dict[str, Any], normalization: str = "sentencepiece") -> Tokenizer:
    """The fast tokenizer for ``model_path`` (an ``spm.model``) with ``settings`` (``read_settings``), normalising
    as ``normalization`` (one of NORMALIZATIONS) says."""
    if normalization not in NORMALIZATIONS:
        raise KbertError(f"spm normalization '{normalization}' is unknown; known: {', '.join(NORMALIZATIONS)}")
    model_path = Path(model_path)
    proto = read_spm_model(model_path)
    try:
        tokenizer = Tokenizer(Unigram([(p.piece, p.score) for p in proto.pieces], unk_id=proto.trainer_spec.unk_id,
                                      byte_fallback=False))
        # Control pieces ([PAD], [CLS], [SEP]) are special added tokens, user-defined pieces plain ones (SpmConverter).
        tokenizer.add_tokens([AddedToken(p.piece, normalized=False, special=p.type == CONTROL)
                              for p in proto.pieces if p.type in (CONTROL, USER_DEFINED)])
        tokenizer.normalizer = normalizers.Sequence(normalizer_steps(proto, settings["do_lower_case"], normalization))
        splits = [pre_tokenizers.Punctuation(behavior="isolated")] if settings["split_by_punct"] else []
        splits.append(pre_tokenizers.Metaspace(replacement=SPIECE_UNDERLINE, prepend_scheme="always"))
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(splits)
        tokenizer.decoder = decoders.Metaspace(replacement=SPIECE_UNDERLINE, prepend_scheme="always")
    except Exception as exc:  # the tokenizers library raises plain Exception (e.g. for a damaged charsmap)
        raise KbertError(f"{model_path}: cannot build a tokenizer from this SentencePiece model: {exc}") from None

    for index, token in settings["added_tokens"]:  # added_tokens.json / added_tokens_decoder, by id
        existing = tokenizer.token_to_id(token["content"])
        tokenizer.add_tokens([AddedToken(**token)])
        got = tokenizer.token_to_id(token["content"])
        if got != index:
            raise KbertError(f"{model_path.parent}: added token {token['content']!r} has id {index} in the tokenizer "
                             f"files but would get {got} ({len(proto.pieces)} pieces in {model_path.name}"
                             f"{'' if existing is None else ', where it already is a piece'})")
    named = [*settings["special_tokens"].values(), *settings["additional_special_tokens"]]
    tokenizer.add_special_tokens([AddedToken(**t) for t in named])  # those already there keep their ids

    cls, sep = settings["special_tokens"]["cls_token"]["content"], settings["special_tokens"]["sep_token"]["content"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, tokenizer.token_to_id(cls)), (sep, tokenizer.token_to_id(sep))],
    )
    return tokenizer


def cache_key(model_path: Path, settings: dict[str, Any]) -> str:
    """What the conversion depends on: the model file's bytes, the settings and the converter's version."""
    digest = hashlib.sha256(f"{CONVERTER_VERSION}|{file_sha256(model_path)}|".encode())
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def load_spm_tokenizer(folder: Path, normalization: str = "sentencepiece") -> Tokenizer:
    """The tokenizer of a checkpoint folder with ``spm.model``: the cached conversion beside it when there is one for
    this model file, these settings and this normalization, else converted and cached (in memory only where the
    folder is read-only). Padding and truncation are off: kbert pads per batch and truncates itself."""
    folder = Path(folder)
    model_path = folder / "spm.model"
    settings = read_settings(folder)
    cached = folder / f"{CACHE_PREFIX}{cache_key(model_path, {**settings, 'normalization': normalization})}.json"
    tokenizer = None
    if cached.is_file():
        try:
            tokenizer = read_tokenizer(cached)
        except KbertError:  # a damaged cache file is converted again and replaced
            tokenizer = None
    if tokenizer is None:
        text = convert_spm(model_path, settings, normalization).to_str()
        # What the cached file gives: its JSON stores the scores to within an ulp of a double, so every load,
        # this one included, segments alike even where two segmentations nearly tie.
        tokenizer = Tokenizer.from_str(text)
        try:
            write_text(cached, text)
        except KbertError:  # a read-only folder: convert on every load
            pass
        else:
            for stale in folder.glob(f"{CACHE_PREFIX}*.json"):  # earlier conversions (another model file, settings)
                if stale != cached:
                    try:
                        stale.unlink(missing_ok=True)
                    except OSError:
                        pass
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer
