"""OpenAI's Videos API on our model, without Ray or HTTP: create bodies, forms, errors, job objects."""

import base64
import io

import pytest
from PIL import Image

from deployments.jobs.records import COMPLETED, FAILED, JobError, JobPage, JobRecord
from deployments.protocol import videos
from deployments.protocol.video import GenerationDefaults
from deployments.protocol.videos import (
    ApiError,
    form_fields,
    image_data_url,
    parse_list_query,
    parse_remix,
    parse_video_create,
)

T2V = GenerationDefaults(width=64, height=64, fps=16, max_session_seconds=60)
I2V = GenerationDefaults(width=64, height=64, fps=16, image_conditioned=True)


def create(body, defaults=T2V, accepts_actions=True):
    return parse_video_create(body, defaults, ["world-model"], 4, accepts_actions)


def refused(body, **kwargs) -> ApiError:
    with pytest.raises(ApiError) as info:
        create(body, **kwargs)
    return info.value


def png(width=8, height=8) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 10, 10)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_openai_fields_and_defaults():
    made = create({"prompt": "a lighthouse", "model": "world-model", "size": "96x64", "seconds": "1"})
    assert (made.model, made.seconds, made.size) == ("world-model", "1", "96x64")
    assert (made.spec.width, made.spec.height, made.spec.num_frames) == (96, 64, 21)  # 16 frames -> 2 blocks
    default = create({"prompt": "a lighthouse"})
    assert (default.model, default.seconds, default.size, default.spec.num_frames) == ("world-model", "4", "64x64", 69)
    ours = create({"prompt": "x", "num_frames": 9, "fps": 8, "seed": 3})
    assert (ours.seconds, ours.spec.seed, ours.spec.num_blocks) == ("1.125", 3, 1)


@pytest.mark.parametrize(
    "body, message, param, code",
    [
        ({}, "Invalid video request: prompt: is required", "prompt", "invalid_request"),
        ({"prompt": "  "}, "Invalid video request: prompt: must be a non-blank string", "prompt", "invalid_request"),
        ({"prompt": "x", "size": "65x64"}, "Invalid video request: size (width 65): must be a positive multiple of 16, got 65", "size", "invalid_request"),
        ({"prompt": "x", "seconds": "0"}, 'Invalid video request: seconds: must be a positive integer string, e.g. "4"', "seconds", "invalid_request"),
        ({"prompt": "x", "seconds": "100"}, "Invalid video request: seconds: 1605 frames at 16 fps is longer than this server's limit of 60 s per session", "seconds", "invalid_request"),
        ({"prompt": "x", "promt": "y"}, "Invalid video request: promt: unknown field", None, "invalid_request"),
        ({"prompt": "x", "model": "sora-2"}, "Model mismatch: request specifies 'sora-2' but server is running 'world-model'.", "model", "model_mismatch"),
        ({"prompt": "x", "seed": "5"}, "Invalid video request: seed: must be an integer", "seed", "invalid_request"),
        ([1], "The request body must be a JSON object (or a form)", None, "invalid_request"),
    ],
)
def test_bad_input_is_a_400_with_openais_shape(body, message, param, code):
    error = refused(body)
    assert error.status == 400 and error.message.startswith(message) and error.param == param and error.code == code
    assert error.body() == {"error": {"message": error.message, "type": "invalid_request_error", "param": param, "code": code}}


def test_input_reference_as_data_url_object_or_upload():
    url = image_data_url(png(), "application/octet-stream")  # the bytes say PNG
    assert url.startswith("data:image/png;base64,")
    for reference in (url, {"image_url": url}):
        assert create({"prompt": "x", "input_reference": reference}, I2V).spec.image.shape == (8, 8, 3)
    error = refused({"prompt": "x"}, defaults=I2V)
    assert error.param == "image_reference" and "needs a start image" in error.message
    error = refused({"prompt": "x", "input_reference": "data:image/png;base64,AAAA"}, defaults=I2V)
    assert error.param == "input_reference" and "not a decodable" in error.message
    error = refused({"prompt": "x", "input_reference": {"file_id": "file_1"}}, defaults=I2V)
    assert error.param == "input_reference" and "file_id references are not supported" in error.message
    with pytest.raises(ApiError) as not_image:
        image_data_url(b"GIF89a....", "image/gif")
    assert not_image.value.param == "input_reference" and not_image.value.status == 400
    with pytest.raises(ApiError) as too_big:
        image_data_url(b"\x89PNG\r\n\x1a\n" + bytes(videos.IMAGE_MAX_BYTES))
    assert too_big.value.status == 413


def test_forms_read_back_as_the_json_they_stand_for():
    fields = form_fields([
        ("prompt", "5"), ("seconds", "1"), ("seed", "5"), ("fps", "8"), ("size", "64x64"),
        ("input_reference[image_url]", "data:image/png;base64,AAAA"),
        ("actions", '[[["w"], [], []]]'), ("extra_params[a]", "1"), ("tags[]", "x"), ("tags[]", "2"),
    ])
    assert fields == {
        "prompt": "5", "seconds": "1", "seed": 5, "fps": 8, "size": "64x64",
        "input_reference": {"image_url": "data:image/png;base64,AAAA"},
        "actions": [[["w"], [], []]], "extra_params": {"a": 1}, "tags": ["x", 2],
    }
    with pytest.raises(ApiError):
        form_fields([("a[b][c]", "1")])
    with pytest.raises(ApiError):
        form_fields([("x[]", "1"), ("x[k]", "2")])


def test_action_scripts():
    made = create({"prompt": "x", "num_frames": 21, "actions": [[["w"], ["w", "l"], []], [[], ["a"], ["i"]]]})
    assert made.actions == (("w",), ("w", "l"), (), (), ("a",), ("i",))
    for script, text in [
        ([], "actions: must be a list with one entry per block, each a list of 3 per-latent-frame lists of keys"),
        ([[["w"], []]], "actions[0]: must be a list of 3 per-latent-frame lists of keys"),
        ([[[], [], []], [[], [], ["q"]]], "actions[1][2] has unknown key 'q'"),
        ([[[], [], []]] * 3, "actions: 3 blocks of actions for a video of 2 blocks"),
    ]:
        error = refused({"prompt": "x", "num_frames": 21, "actions": script})
        assert error.param == "actions" and text in error.message, error.message
    error = refused({"prompt": "x", "actions": [[[], [], []]]}, accepts_actions=False)
    assert "no camera adapter" in error.message


def test_list_query():
    assert parse_list_query(None, None, None) == videos.ListQuery(20, None, "desc")
    assert parse_list_query("5", "video_x", "asc") == videos.ListQuery(5, "video_x", "asc")
    for limit, order in (("0", None), ("101", None), ("ten", None), (None, "up")):
        with pytest.raises(ApiError) as error:
            parse_list_query(limit, None, order)
        assert error.value.status == 400 and error.value.param in ("limit", "order")


def test_job_objects_parse_as_the_sdks_video_model():
    # What the SDK does with a response body: lenient construction (our sizes are not among OpenAI's literals).
    from openai._models import construct_type
    from openai.types import Video, VideoDeleteResponse

    def as_video(wire):
        return construct_type(type_=Video, value=wire)

    done = JobRecord(id="video_" + "a" * 32, status=COMPLETED, created_at=10.5, model="world-model", prompt="p",
                     seconds="1", size="64x64", fps=8, num_frames=9, progress=100, seed=4, completed_at=12.0, expires_at=99.0)
    failed = JobRecord(id="video_" + "b" * 32, status=FAILED, created_at=11.0, model="world-model", prompt="p",
                       seconds="1", size="64x64", fps=8, num_frames=9, error=JobError("replica_lost", "lost"))
    wire = videos.video_object(done)
    assert wire["object"] == "video" and wire["created_at"] == 10 and wire["completed_at"] == 12 and wire["error"] is None
    video = as_video(wire)
    assert (video.status, video.progress, video.size, video.seconds) == ("completed", 100, "64x64", "1")
    assert as_video(videos.video_object(failed)).error.code == "replica_lost"
    assert video.remixed_from_video_id is None
    remix = JobRecord(id="video_" + "c" * 32, status=COMPLETED, created_at=13.0, model="world-model", prompt="q",
                      seconds="1", size="64x64", fps=8, num_frames=9, remixed_from_video_id=done.id)
    assert as_video(videos.video_object(remix)).remixed_from_video_id == done.id
    listing = videos.video_list(JobPage([failed, done], has_more=True))
    assert (listing["first_id"], listing["last_id"], listing["has_more"]) == (failed.id, done.id, True)
    assert construct_type(type_=VideoDeleteResponse, value=videos.video_deleted(done.id)).deleted is True


def test_over_capacity_carries_retry_after():
    error = videos.over_capacity("full", 4.6)
    assert error.status == 503 and error.headers() == {"Retry-After": "5"} and error.body()["error"]["code"] == "over_capacity"


def test_base64_of_upload_round_trips():
    data = png()
    assert base64.b64decode(image_data_url(data).split(",", 1)[1]) == data


def test_a_remix_takes_a_prompt_and_nothing_else():
    assert parse_remix({"prompt": "the same walk at night"}) == "the same walk at night"
    for body, param in (({}, "prompt"), ({"prompt": " "}, "prompt"), ({"prompt": 3}, "prompt"),
                        ({"prompt": "x", "seed": 4}, "seed")):
        with pytest.raises(ApiError) as error:
            parse_remix(body)
        assert error.value.status == 400 and error.value.param == param
    with pytest.raises(ApiError) as error:
        parse_remix({"prompt": "x", "size": "64x64"})
    assert "a remix takes only a prompt" in error.value.message
    with pytest.raises(ApiError):
        parse_remix(["prompt"])
