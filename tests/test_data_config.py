"""DataConfig: its rules, and the conf/data/ presets composed through Hydra."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conf import CONF_DIR  # importing conf registers the schema that train.yaml names
from data import DataConfig


def test_defaults_are_the_offline_stdlib_corpus():
    cfg = DataConfig()
    assert (cfg.source, cfg.tokenizer, cfg.name) == ("stdlib", "gpt2", "stdlib")
    assert cfg.resolved_data_dir() == Path("data_cache/stdlib")
    assert cfg.resolved_hf_cache_dir() == Path("data_cache/stdlib/hf_cache")
    assert DataConfig(data_dir="~/d", hf_cache_dir="/c").resolved_hf_cache_dir() == Path("/c")
    assert DataConfig(data_dir="~/d").resolved_data_dir() == Path.home() / "d"
    assert DataConfig(num_proc=3).resolved_num_proc() == 3 and DataConfig().resolved_num_proc() >= 1


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(source="web"), r"data.source must be one of \('stdlib', 'files', 'hub'\), got 'web'"),
        (dict(tokenizer="sentencepiece"), r"data.tokenizer must be one of \('gpt2', 'char', 'bpe'\)"),
        (dict(tokenizer="bpe"), r"data.vocab_size must be set when tokenizer is 'bpe' \(e.g. data.vocab_size=8192\)"),
        (dict(tokenizer="bpe", vocab_size=256), r"data.vocab_size must be in \[257, 33554689\], got 256"),
        (dict(tokenizer="bpe", vocab_size=10**9), r"data.vocab_size must be in \[257, 33554689\], got 1000000000"),
        (
            dict(tokenizer="char", vocab_size=512),
            r"data.vocab_size is read only when tokenizer is 'bpe', and this "
            r"tokenizer is 'char' \(set data.tokenizer=bpe, or leave it null\), got 512",
        ),
        (dict(name="../escape"), r"data.name must be letters, digits"),
        (dict(name=""), r"data.name must be letters, digits, '_', '.' or '-' \(it names a directory\), got ''"),
        (dict(text_column=""), r"data.text_column must be a non-empty text, got ''"),
        (dict(path=""), r"data.path must be a non-empty text, got ''"),
        (dict(val_fraction=0), r"data.val_fraction must be in \(0, 1\), got 0"),
        (dict(val_fraction=1.0), r"data.val_fraction must be in \(0, 1\), got 1.0"),
        (dict(max_documents=0), r"data.max_documents must be >= 1, got 0"),
        (dict(num_proc=0), r"data.num_proc must be >= 1, got 0"),
        (dict(split_seed=-1), r"data.split_seed must be >= 0, got -1"),
        (dict(batch_mb=0), r"data.batch_mb must be > 0, got 0"),
        (dict(verify="md5"), r"data.verify must be one of \('sha256', 'size'\), got 'md5'"),
        (dict(source="files"), r"data.path must name a file, directory or glob when source is 'files'"),
        (dict(source="hub"), r"data.dataset must name a Hub dataset or a local dataset directory"),
        # read by another source: ignored, yet it would change the fingerprint (a rebuild)
        (
            dict(path="/x.txt"),
            r"data.path is read only when source is 'files', and this source is 'stdlib' "
            r"\(choose a data= preset of source files, or leave it null\), got '/x.txt'",
        ),
        (dict(source="files", path="a.txt", subset="en"), r"data.subset is read only when source is 'hub'"),
        (
            dict(source="files", path="a.txt", split="test"),
            r"data.split is read only when source is 'hub', "
            r"and this source is 'files' .*leave it \"train\"",
        ),
        (dict(streaming=True), r"data.streaming is read only when source is 'hub'.*leave it false"),
        (dict(source="hub", dataset="d", document_separator="\n"), r"data.document_separator is read only"),
    ],
)
def test_each_rule_names_its_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        DataConfig(**overrides)


def compose_data(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="train", overrides=list(overrides)).data


@pytest.mark.parametrize("preset", ["stdlib", "shakespeare", "shakespeare_char", "openwebtext", "fineweb_edu"])
def test_presets_compose_into_valid_configs(preset):
    cfg = OmegaConf.to_object(compose_data(f"data={preset}"))
    assert isinstance(cfg, DataConfig) and cfg.name == preset


def test_default_composition_is_stdlib_and_overrides_apply():
    assert OmegaConf.to_object(compose_data()) == DataConfig(tokenizer="bpe", vocab_size=4096)
    cfg = OmegaConf.to_object(compose_data("data=files", "data.path=notes/*.md", "data.val_fraction=0.2"))
    assert (cfg.source, cfg.path, cfg.val_fraction) == ("files", "notes/*.md", 0.2)


def test_files_preset_demands_a_path():
    with pytest.raises(ValueError, match="data.path must name a file"):
        OmegaConf.to_object(compose_data("data=files"))


@pytest.mark.parametrize(
    "override, field",
    [
        ("data.val_fraction=true", "val_fraction"),
        ("data.num_proc=1.5", "num_proc"),
        ("data.streaming=maybe", "streaming"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_by_the_typed_merge(override, field):
    with pytest.raises(Exception, match=f"data.{field}"):  # the dataclass itself trusts its types
        compose_data(override)
