from pathlib import Path

import pytest
import yaml

from deployments.app import build_app, build_captioner_app
from deployments.config import AppArgs, EngineParams, load_models_file, resolve_plan
from deployments.errors import ConfigError
from tests.unit.test_options import bound_deployments

ROOT = Path(__file__).resolve().parents[3]


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def proxy_file(tmp_path: Path, **primary_extra) -> Path:
    (tmp_path / "llm").mkdir(exist_ok=True)
    primary = {
        "name": "llm",
        "local_path": "llm",
        "capabilities": {"vision_mode": "proxy", "captioner": "cap"},
        **primary_extra,
    }
    return write(tmp_path, {"models": [primary, {"name": "cap", "hf_id": "org/cap"}]})


def test_repository_models_yaml_is_valid():
    if not (ROOT / "models" / "smollm2").exists():
        pytest.skip("offline default not prepared")
    plan = resolve_plan({"models_file": str(ROOT / "models.yaml")})
    assert plan.primary.weight_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert plan.captioner is not None and plan.captioner.hf_id
    # No captioner offline and a decoder too small to follow the prompt: say it in the text too.
    assert plan.vision is not None and plan.vision.degraded_notice


def test_local_path_is_resolved_relative_to_the_file(tmp_path):
    models = load_models_file(proxy_file(tmp_path))
    assert models.models[0].local_path == str((tmp_path / "llm").resolve())


def test_unknown_key_names_file_and_field(tmp_path):
    path = write(tmp_path, {"models": [{"name": "a", "hf_id": "x/y", "params": {"dtyp": "float16"}}]})
    with pytest.raises(ConfigError) as err:
        load_models_file(path)
    assert str(path) in str(err.value) and "models[0].params.dtyp" in str(err.value)


def test_duplicate_names_rejected(tmp_path):
    path = write(tmp_path, {"models": [{"name": "a", "hf_id": "x/y"}, {"name": "a", "hf_id": "x/z"}]})
    with pytest.raises(ConfigError, match="duplicate model name 'a'"):
        load_models_file(path)


def test_proxy_mode_needs_a_captioner(tmp_path):
    path = write(tmp_path, {"models": [{"name": "a", "hf_id": "x/y", "capabilities": {"vision_mode": "proxy"}}]})
    with pytest.raises(ConfigError, match=r"models\[0\]\.capabilities.*needs a captioner"):
        load_models_file(path)


def test_missing_local_path_and_weight_file(tmp_path):
    with pytest.raises(ConfigError, match=r"models\[0\]\.local_path: .*nowhere does not exist"):
        load_models_file(write(tmp_path, {"models": [{"name": "a", "local_path": "nowhere"}]}))
    (tmp_path / "d").mkdir()
    path = write(tmp_path, {"models": [{"name": "a", "local_path": "d", "weight_file": "m.gguf"}]})
    with pytest.raises(ConfigError, match=r"models\[0\]\.weight_file: .*m.gguf not found"):
        load_models_file(path)


def test_a_projector_file_is_found_beside_the_gguf(tmp_path):
    """`mmproj_file` is looked up where `weight_file` is: in `local_path`, or beside it when it is the file."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "m.gguf").write_bytes(b"")
    entry = {"name": "a", "local_path": "d", "weight_file": "m.gguf", "mmproj_file": "p.gguf"}
    with pytest.raises(ConfigError, match=r"models\[0\]\.mmproj_file: .*d/p.gguf not found"):
        load_models_file(write(tmp_path, {"models": [entry]}))
    (tmp_path / "d" / "p.gguf").write_bytes(b"")
    assert load_models_file(write(tmp_path, {"models": [entry]})).models[0].mmproj_file == "p.gguf"
    as_file = {"name": "a", "local_path": "d/m.gguf", "mmproj_file": "p.gguf"}
    assert load_models_file(write(tmp_path, {"models": [as_file]})).models[0].mmproj_file == "p.gguf"


def test_exactly_one_source(tmp_path):
    with pytest.raises(ConfigError, match="exactly one of hf_id and local_path"):
        load_models_file(write(tmp_path, {"models": [{"name": "a"}]}))


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_models_file(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_models_file(bad)


@pytest.mark.parametrize("value", [False, None, "none", "false", "disabled"])
def test_vision_mode_spellings_of_disabled(tmp_path, value):
    path = write(tmp_path, {"models": [{"name": "a", "hf_id": "x/y", "capabilities": {"vision_mode": value}}]})
    assert load_models_file(path).models[0].capabilities.vision_mode == "disabled"


def test_prompt_template_fields_are_checked(tmp_path):
    captioner = {"name": "c", "hf_id": "x/c", "captioning": {"prompt_template": "Look: {image_path}"}}
    path = write(tmp_path, {"models": [{"name": "a", "hf_id": "x/y"}, captioner]})
    with pytest.raises(ConfigError, match=r"models\[1\]\.captioning: .*may only use"):
        load_models_file(path)


def test_dotted_overrides_map_into_typed_params(tmp_path):
    path = proxy_file(tmp_path, params={"max_tokens": 100, "temperature": 0.5})
    plan = resolve_plan(
        {
            "models_file": str(path),
            "decoder.max_tokens": "64",
            "captioner.dtype": "float16",
            "on_image_failure": "reject",
        }
    )
    assert plan.primary.params.max_tokens == 64  # str from the CLI, int after validation
    assert plan.primary.params.temperature == 0.5  # untouched file value survives
    assert plan.captioner is not None and plan.captioner.params.dtype == "float16"
    assert plan.captioner.hf_id == "org/cap"
    assert plan.vision is not None and plan.vision.on_failure == "reject"


def test_bad_override_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"builder args: decoder\.max_tokens"):
        resolve_plan({"models_file": str(proxy_file(tmp_path)), "decoder.max_tokens": "-3"})
    with pytest.raises(ConfigError, match=r"builder args: decoder\.nonsense"):
        resolve_plan({"models_file": str(proxy_file(tmp_path)), "decoder.nonsense": 1})
    with pytest.raises(ConfigError, match=r"builder args: unknown_arg"):
        resolve_plan({"models_file": str(proxy_file(tmp_path)), "unknown_arg": 1})


def test_vision_mode_override_disables_captioner(tmp_path):
    plan = resolve_plan({"models_file": str(proxy_file(tmp_path)), "vision_mode": "none"})
    assert plan.captioner is None and plan.vision is None


def test_captioner_may_be_a_bare_hub_id(tmp_path):
    (tmp_path / "llm").mkdir()
    caps = {"vision_mode": "proxy", "captioner": "Qwen/Qwen2-VL-2B-Instruct"}
    path = write(tmp_path, {"models": [{"name": "llm", "local_path": "llm", "capabilities": caps}]})
    plan = resolve_plan({"models_file": str(path)})
    assert plan.captioner is not None and plan.captioner.hf_id == "Qwen/Qwen2-VL-2B-Instruct"


def test_native_vision_has_no_captioner_and_a_per_model_image_limit(tmp_path):
    models = [
        {"name": "a", "hf_id": "x/y", "capabilities": {"vision_mode": "native"}},
        {"name": "b", "hf_id": "x/z", "capabilities": {"vision_mode": "native", "max_images_per_request": 2}},
    ]
    path = write(tmp_path, {"models": models, "images": {"max_images_per_request": 5}})
    plan = resolve_plan({"models_file": str(path)})
    assert plan.captioner is None and plan.primary.capabilities.vision_mode == "native"
    assert plan.primary.capabilities.max_images_per_request == 5  # unset: the file-level limit
    other = resolve_plan({"models_file": str(path), "model": "b"})
    assert other.primary.capabilities.max_images_per_request == 2


def test_primary_selection(tmp_path):
    path = proxy_file(tmp_path)
    assert resolve_plan({"models_file": str(path), "model": "cap"}).primary.name == "cap"
    with pytest.raises(ConfigError, match="no entry named 'zzz'"):
        resolve_plan({"models_file": str(path), "model": "zzz"})


def test_every_param_has_a_default_and_description():
    for name, field in EngineParams.model_fields.items():
        assert field.description, name
        assert not field.is_required(), name
    assert AppArgs().models_file == "models.yaml"


def test_images_section_reaches_the_plan_with_file_root_resolved(tmp_path):
    (tmp_path / "pictures").mkdir()
    path = proxy_file(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["images"] = {"file_root": "pictures", "allow_hosts": ["10.1.0.0/16"], "max_image_bytes": 1000}
    write(tmp_path, data)
    plan = resolve_plan({"models_file": str(path)})
    assert plan.images.file_root == str((tmp_path / "pictures").resolve())
    assert plan.images.max_image_bytes == 1000 and plan.images.allow_hosts == ["10.1.0.0/16"]
    data["images"] = {"file_root": "nowhere"}
    write(tmp_path, data)
    with pytest.raises(ConfigError, match=r"images\.file_root"):
        load_models_file(path)


def test_batching_and_cache_settings_are_validated(tmp_path):
    path = proxy_file(tmp_path, params={"batching": "paged"})
    with pytest.raises(ConfigError, match="batching"):
        load_models_file(path)
    data = yaml.safe_load(proxy_file(tmp_path).read_text())
    data["models"][1]["captioning"] = {"max_batch_size": 0}
    with pytest.raises(ConfigError, match="max_batch_size"):
        load_models_file(write(tmp_path, data))
    data["models"][1]["captioning"] = {"max_batch_size": 4}
    data["proxy_vision"] = {"cache_entries": 0}
    plan = resolve_plan({"models_file": str(write(tmp_path, data)), "decoder.cpu_threads": "all"})
    assert plan.captioner is not None and plan.captioner.captioning.max_batch_size == 4
    assert plan.vision is not None and plan.vision.cache_entries == 0
    assert plan.primary.params.cpu_threads == "all"


def test_an_unknown_capabilities_key_is_refused_by_name(tmp_path):
    caps = {"vision_mode": "proxy", "captioner": "cap", "vision_proxy": {"model": "cap"}}
    path = write(
        tmp_path, {"models": [{"name": "a", "hf_id": "x/y", "capabilities": caps}, {"name": "cap", "hf_id": "c"}]}
    )
    with pytest.raises(ConfigError) as err:
        load_models_file(path)
    message = str(err.value)
    assert str(path) in message and "models[0].capabilities.vision_proxy" in message


def test_the_captioner_entry_carries_its_own_settings(tmp_path):
    path = proxy_file(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["models"][1]["captioning"] = {"prompt_template": "Say: {user_text}", "max_new_tokens": 9}
    data["proxy_vision"] = {"timeout_s": 3, "on_failure": "reject", "degraded_notice": "[No image.] "}
    plan = resolve_plan({"models_file": str(write(tmp_path, data))})
    assert plan.captioner is not None and plan.captioner.captioning.prompt("hi") == "Say: hi"
    assert plan.captioner.captioning.max_new_tokens == 9
    assert plan.vision is not None and (plan.vision.timeout_s, plan.vision.on_failure) == (3, "reject")
    assert plan.vision.degraded_notice == "[No image.] "
    data["proxy_vision"] = {"degraded_notice": ""}
    with pytest.raises(ConfigError, match=r"proxy_vision\.degraded_notice"):
        load_models_file(write(tmp_path, data))


def test_builder_overrides_are_typed_params_holding_only_what_was_given():
    args = AppArgs.model_validate({"decoder.max_tokens": "64", "captioner": {"dtype": "float16"}})
    assert isinstance(args.decoder, EngineParams) and args.decoder.max_tokens == 64
    assert args.decoder.model_fields_set == {"max_tokens"} and args.captioner.model_fields_set == {"dtype"}


@pytest.mark.parametrize("builder", [build_app, build_captioner_app])
def test_builders_report_bad_args_as_config_errors(builder, tmp_path):
    with pytest.raises(ConfigError, match=r"^builder args: decoder\.max_tokens: ") as err:
        builder({"models_file": str(proxy_file(tmp_path)), "decoder.max_tokens": 0})
    assert "greater than 0" in str(err.value)
    with pytest.raises(ConfigError, match=r"^builder args: captioner\.nonsense: "):
        builder({"captioner.nonsense": 1})


def test_captioning_on_an_entry_no_entry_names_as_captioner_is_refused(tmp_path):
    """Captioning settings on the primary's own entry would be ignored."""
    path = proxy_file(tmp_path, captioning={"prompt_template": "Describe: {user_text}"})
    with pytest.raises(ConfigError) as err:
        resolve_plan({"models_file": str(path)})
    message = str(err.value)
    assert message.startswith(f"{path}: models[0].captioning: no entry names 'llm' in capabilities.captioner")
    assert "belongs on the captioner's own entry" in message and "move it to the entry of 'cap'" in message
    hub = {"vision_mode": "proxy", "captioner": "org/vlm"}
    path = write(tmp_path, {"models": [{"name": "a", "hf_id": "x/y", "capabilities": hub, "captioning": {}}]})
    with pytest.raises(ConfigError, match=r"models\[0\]\.captioning: .*: add an entry named 'org/vlm'"):
        resolve_plan({"models_file": str(path)})


def test_captioning_on_a_named_captioner_is_kept_whatever_the_primary(tmp_path):
    data = yaml.safe_load(proxy_file(tmp_path).read_text())
    data["models"][1]["captioning"] = {"max_new_tokens": 9}
    path = write(tmp_path, data)
    assert resolve_plan({"models_file": str(path), "vision_mode": "none"}).captioner is None
    assert resolve_plan({"models_file": str(path), "model": "cap"}).primary.captioning.max_new_tokens == 9


def test_a_fake_section_needs_engine_fake(tmp_path):
    path = write(tmp_path, {"models": [{"name": "a", "hf_id": "x/y", "fake": {"token_delay_ms": 20}}]})
    with pytest.raises(ConfigError) as err:
        resolve_plan({"models_file": str(path)})
    message = str(err.value)
    assert message.startswith(f"{path}: models[0].fake: ")
    assert "applies only to engine: fake" in message and "model 'a' has engine 'auto'" in message
    path = write(tmp_path, {"models": [{"name": "a", "engine": "fake", "fake": {"token_delay_ms": 20}}]})
    assert resolve_plan({"models_file": str(path)}).primary.fake.token_delay_ms == 20


# --- several models behind one endpoint ----------------------------------------------------------


def several(tmp_path: Path, **file_level) -> Path:
    fake = {"engine": "fake"}
    return write(
        tmp_path,
        {
            "models": [
                {"name": "a", **fake, "capabilities": {"vision_mode": "proxy", "captioner": "cap"}},
                {"name": "b", **fake, "capabilities": {"vision_mode": "proxy", "captioner": "cap"}},
                {"name": "c/v2#1", **fake, "capabilities": {"vision_mode": "proxy", "captioner": "other"}},
                {"name": "d", **fake},
                {"name": "cap", **fake},
                {"name": "other", **fake},
            ],
            **file_level,
        },
    )


def test_primaries_are_served_in_order_with_their_captioners_each_once(tmp_path):
    plan = resolve_plan(
        {"models_file": str(several(tmp_path, primaries=["b", "a", "c/v2#1", "d"])), "decoder.max_tokens": 7}
    )
    assert [m.name for m in plan.primaries] == ["b", "a", "c/v2#1", "d"] and plan.primary.name == "b"
    assert [c.name for c in plan.captioners] == ["cap", "other"]
    assert [getattr(plan.captioner_of(m), "name", None) for m in plan.primaries] == ["cap", "cap", "other", None]
    assert {m.params.max_tokens for m in plan.primaries} == {7}  # builder overrides apply to every primary
    # Builder arg `model` serves one entry alone; without `primaries`, the first entry alone.
    assert [
        m.name
        for m in resolve_plan({"models_file": str(several(tmp_path, primaries=["a", "b"])), "model": "d"}).primaries
    ] == ["d"]
    alone = resolve_plan({"models_file": str(several(tmp_path))})
    assert [m.name for m in alone.primaries] == ["a"] and [c.name for c in alone.captioners] == ["cap"]


@pytest.mark.parametrize(
    ("primaries", "message"),
    [(["a", "zzz"], "primaries: no entry named 'zzz'"), (["a", "a"], "a model is named twice"), ([], "at least 1")],
)
def test_primaries_must_name_entries_once(tmp_path, primaries, message):
    with pytest.raises(ConfigError, match=message):
        resolve_plan({"models_file": str(several(tmp_path, primaries=primaries))})


def test_the_builders_make_a_deployment_per_primary_and_per_captioner(tmp_path):
    args = {"models_file": str(several(tmp_path, primaries=["a", "b", "c/v2#1", "d"])), "decoder_gpus": 0}
    main = build_app(args)
    names = {d.name for d in _deployments(main)}
    assert names == {
        "Ingress",
        "BatchRunner",
        "PrimaryDecoder-a",
        "PrimaryDecoder-b",
        "PrimaryDecoder-c-v2-1",
        "PrimaryDecoder-d",
    }
    assert {d.name for d in _deployments(build_captioner_app(args))} == {"VisionCaptioner-cap", "VisionCaptioner-other"}
    # The ingress finds each primary's captioner by its deployment name.
    ingress_config = main._bound_deployment.init_args[0]
    assert [(m.name, m.captioner_deployment) for m in ingress_config.models] == [
        ("a", "VisionCaptioner-cap"),
        ("b", "VisionCaptioner-cap"),
        ("c/v2#1", "VisionCaptioner-other"),
        ("d", "VisionCaptioner"),
    ]
    # One primary keeps the names every tool and serve_config.yaml override knows.
    one = {"models_file": str(several(tmp_path)), "decoder_gpus": 0}
    assert {d.name for d in _deployments(build_app(one))} == {"Ingress", "BatchRunner", "PrimaryDecoder"}
    assert {d.name for d in _deployments(build_captioner_app(one))} == {"VisionCaptioner"}


def _deployments(app) -> list:
    return list(bound_deployments(app).values())


def test_tool_call_format_and_chat_template_are_checked(tmp_path):
    entry = {"name": "a", "engine": "fake", "capabilities": {"tool_call_format": "qwen"}}
    with pytest.raises(ConfigError) as err:
        load_models_file(write(tmp_path, {"models": [entry]}))
    assert "models[0].capabilities.tool_call_format: Input should be 'auto', 'hermes'" in str(err.value)
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "good.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    (tmp_path / "templates" / "bad.jinja").write_text("{% for m in messages %}{{ m.content }")
    good = {"name": "a", "engine": "fake", "chat_template": "templates/good.jinja"}
    assert load_models_file(write(tmp_path, {"models": [good]})).models[0].chat_template == str(
        (tmp_path / "templates" / "good.jinja").resolve()
    )
    for name, message in (("bad.jinja", "is not a valid Jinja template: line 1"), ("none.jinja", "is not a file")):
        bad = {**good, "chat_template": f"templates/{name}"}
        with pytest.raises(ConfigError, match=f"models\\[0\\].chat_template: .*{name} {message}"):
            load_models_file(write(tmp_path, {"models": [bad]}))
