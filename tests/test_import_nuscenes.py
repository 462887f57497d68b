"""The nuScenes-layout importer round-trips a generated dataset: frames, times, poses, calibration, boxes."""

from __future__ import annotations

import json
import math
import shutil
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lightning_vstream.cli import main
from lightning_vstream.decode import make_decoder
from lightning_vstream.demos.synth import read_stamp
from lightning_vstream.encode import EncodeSettings
from lightning_vstream.errors import ConfigurationError, DatasetImportError
from lightning_vstream.importers import NuScenesImport, import_nuscenes
from lightning_vstream.indexing import load_index

pytest.importorskip("PIL.Image")
from _nuscenes_fixture import FixtureInfo, write_nuscenes
from _nuscenes_fixture import token as fixture_token

H264 = EncodeSettings(codec="h264", crf=18)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> FixtureInfo:
    return write_nuscenes(tmp_path_factory.mktemp("nuscenes"))


@pytest.fixture(scope="module")
def imported(dataset: FixtureInfo, tmp_path_factory: pytest.TempPathFactory) -> NuScenesImport:
    out = tmp_path_factory.mktemp("imported")
    return import_nuscenes(dataset.root, out, cameras=list(dataset.cameras), settings=H264, progress=False)


def _tables(info: FixtureInfo) -> dict[str, dict[str, dict[str, Any]]]:
    folder = info.root / info.version
    return {p.stem: {r["token"]: r for r in json.loads(p.read_text())} for p in folder.glob("*.json")}


def _rotate(q: list[float], v: np.ndarray) -> np.ndarray:
    """v rotated by quaternion q = [w, x, y, z] (q v q*), independent of the importer's matrix formula."""
    w, u = q[0], np.asarray(q[1:], np.float64)
    return 2 * np.dot(u, v) * u + (w * w - np.dot(u, u)) * v + 2 * w * np.cross(u, v)


def _matrix(q: list[float]) -> np.ndarray:
    return np.stack([_rotate(q, e) for e in np.eye(3)], axis=1)


def _annotations(imported: NuScenesImport, scene: str) -> dict[str, np.ndarray]:
    with np.load(imported.annotations / f"{scene}.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def test_frames_are_aligned_frame_exact_and_keep_their_times(dataset: FixtureInfo, imported: NuScenesImport) -> None:
    tables = _tables(dataset)
    index = load_index(imported.index)
    assert [c.clip_id for c in index] == dataset.scenes == list(imported.scenes)
    assert index.camera_names == dataset.cameras
    expected_cycles = {
        s: [j for j in range(dataset.cycles[s]) if not any((s, c, j) in dataset.dropped for c in dataset.cameras)]
        for s in range(len(dataset.scenes))
    }
    assert [c.frame_count for c in index] == [len(expected_cycles[s]) for s in range(len(dataset.scenes))]
    assert imported.left_out == len(dataset.cameras) - 1  # the other cameras' images of the dropped cycle
    assert imported.key_frames == 3 * len(dataset.scenes)
    for s, clip in enumerate(index):
        ann = _annotations(imported, clip.clip_id)
        tokens = ann["frame_camera.sample_data_token"]
        for k, cam in enumerate(clip.cameras):
            decoder = make_decoder(cam.path)
            stamps = [read_stamp(decoder.get(i)) for i in range(clip.frame_count)]
            # Frame i of every camera is capture cycle expected_cycles[s][i] of scene s, camera k.
            assert [(st.clip, st.camera, st.frame) for st in stamps] == [(s, k, j) for j in expected_cycles[s]]
            records = [tables["sample_data"][t] for t in tokens[:, k]]
            num, den = decoder.info.time_base
            assert [Fraction(p * num, den) for p in decoder.info.pts] == [
                Fraction(r["timestamp"], 10**6) for r in records
            ]
            assert all(Path(r["filename"]).parts[1] == cam.name for r in records)
        assert ann["timestamp"] == pytest.approx(
            [tables["sample_data"][t]["timestamp"] / 1e6 for t in tokens[:, 0]], abs=1e-6
        )
        assert ann["frame_index"].tolist() == list(range(clip.frame_count))


def test_annotations_equal_the_tables(dataset: FixtureInfo, imported: NuScenesImport) -> None:
    tables = _tables(dataset)
    categories = {c["token"]: c["name"] for c in tables["category"].values()}
    for scene_name in dataset.scenes:
        ann = _annotations(imported, scene_name)
        scene = next(r for r in tables["scene"].values() if r["name"] == scene_name)
        assert str(ann["format"]) == "lightning_vstream.annotations" and int(ann["version"]) == 1
        assert str(ann["clip.scene_token"]) == scene["token"]
        assert str(ann["clip.location"]) == "singapore-onenorth"
        assert ann["camera_names"].tolist() == list(dataset.cameras)
        first = ann["frame_camera.sample_data_token"][0]
        for k in range(len(dataset.cameras)):
            cs = tables["calibrated_sensor"][tables["sample_data"][first[k]]["calibrated_sensor_token"]]
            # The table's matrix, with the principal point moved to the pixel-centre-at-i+0.5 convention.
            np.testing.assert_allclose(
                ann["camera.intrinsics"][k],
                np.add(cs["camera_intrinsic"], [[0, 0, 0.5], [0, 0, 0.5], [0, 0, 0]]),
                rtol=1e-6,
            )
            np.testing.assert_allclose(ann["camera.extrinsics"][k][:3, :3], _matrix(cs["rotation"]), atol=1e-6)
            np.testing.assert_allclose(ann["camera.extrinsics"][k][:3, 3], cs["translation"], rtol=1e-6)
            np.testing.assert_array_equal(ann["camera.extrinsics"][k][3], [0, 0, 0, 1])
        lengths = ann["frame.boxes.lengths"]
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        keys = ann["frame.is_key_frame"]
        assert keys.sum() == 3 and (lengths[~keys] == 0).all()
        for i, tokens in enumerate(ann["frame_camera.sample_data_token"]):
            records = [tables["sample_data"][t] for t in tokens]
            assert all(r["is_key_frame"] == bool(keys[i]) for r in records)
            for k, record in enumerate(records):
                pose = tables["ego_pose"][record["ego_pose_token"]]
                np.testing.assert_allclose(
                    ann["frame_camera.cam_ego_pose"][i, k][:3, 3], pose["translation"], rtol=1e-6
                )
                np.testing.assert_allclose(
                    ann["frame_camera.cam_ego_pose"][i, k][:3, :3], _matrix(pose["rotation"]), atol=1e-6
                )
            ego = ann["frame.ego_pose"][i].astype(np.float64)
            np.testing.assert_array_equal(ego, ann["frame_camera.cam_ego_pose"][i, 0])
            if not keys[i]:
                assert ann["frame.token"][i] == tokens[0]
                continue
            sample_token = records[0]["sample_token"]
            assert ann["frame.token"][i] == sample_token
            expected = [a for a in tables["sample_annotation"].values() if a["sample_token"] == sample_token]
            rows = slice(offsets[i], offsets[i + 1])
            assert sorted(ann["frame.box_tokens"][rows]) == sorted(a["token"] for a in expected)
            for box, label, token, inst, lidar in zip(
                ann["frame.boxes"][rows],
                ann["frame.labels"][rows],
                ann["frame.box_tokens"][rows],
                ann["frame.instance_tokens"][rows],
                ann["frame.num_lidar_pts"][rows],
            ):
                a = tables["sample_annotation"][token]
                # Back to global with the delivered ego pose: the table's centre, size and heading.
                centre = ego[:3, :3] @ box[:3].astype(np.float64) + ego[:3, 3]
                np.testing.assert_allclose(centre, a["translation"], atol=2e-3)
                np.testing.assert_allclose(box[3:6], a["size"], rtol=1e-6)
                heading = _matrix(a["rotation"])[:, 0]
                ego_yaw = math.atan2(ego[1, 0], ego[0, 0])
                assert math.remainder(
                    box[6] + ego_yaw - math.atan2(heading[1], heading[0]), 2 * math.pi
                ) == pytest.approx(0, abs=1e-5)
                name = categories[tables["instance"][a["instance_token"]]["category_token"]]
                assert ann["clip.class_names"][label] == name and inst == a["instance_token"]
                assert lidar == a["num_lidar_pts"]
                # Velocity: the devkit's difference of the neighbouring annotations, in ego axes.
                first_ann = tables["sample_annotation"][a["prev"]] if a["prev"] else a
                last_ann = tables["sample_annotation"][a["next"]] if a["next"] else a
                span = (
                    tables["sample"][last_ann["sample_token"]]["timestamp"]
                    - tables["sample"][first_ann["sample_token"]]["timestamp"]
                ) / 1e6
                velocity = (
                    np.subtract(last_ann["translation"], first_ann["translation"]) / span if span else np.zeros(3)
                )
                np.testing.assert_allclose(box[7:9], (ego[:3, :3].T @ velocity)[:2], atol=1e-4)


def test_a_landmark_projected_with_the_delivered_geometry_lands_on_its_marker(
    dataset: FixtureInfo, imported: NuScenesImport
) -> None:
    """Intrinsics, extrinsics and per-camera ego poses, chained as documented, hit the drawn pixel."""
    index = load_index(imported.index)
    for s, clip in enumerate(index):
        ann = _annotations(imported, clip.clip_id)
        for k, cam in enumerate(clip.cameras):
            decoder = make_decoder(cam.path, layout="hwc")
            landmark = dataset.landmarks[(s, cam.name)]
            for i in range(clip.frame_count):
                ego_from_global = np.linalg.inv(ann["frame_camera.cam_ego_pose"][i, k].astype(np.float64))
                sensor_from_ego = np.linalg.inv(ann["camera.extrinsics"][k].astype(np.float64))
                q = sensor_from_ego @ ego_from_global @ landmark
                u, v, w = ann["camera.intrinsics"][k].astype(np.float64) @ q[:3]
                col, row = math.floor(u / w), math.floor(v / w)  # continuous coordinates -> the pixel holding them
                patch = decoder.get(i)[row - 1 : row + 2, col - 1 : col + 2].numpy().astype(int)
                redness = patch[..., 0] - patch[..., 1:].max(axis=-1)
                assert redness.min() > 120, (clip.clip_id, cam.name, i, (u / w, v / w), patch[..., 0])


def test_rerun_skips_videos_already_done(dataset: FixtureInfo, imported: NuScenesImport) -> None:
    out = imported.index.parent
    again = import_nuscenes(dataset.root, out, cameras=list(dataset.cameras), settings=H264, progress=False)
    assert (again.encode.files_encoded, again.encode.files_skipped) == (0, 6)
    assert again.frames == imported.frames


def test_key_frames_only_without_sweeps_and_cli(
    dataset: FixtureInfo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "nusc"
    shutil.copytree(dataset.root / dataset.version, root / dataset.version)
    shutil.copytree(dataset.root / "samples", root / "samples")
    with pytest.raises(
        DatasetImportError,
        match=r"camera images listed in v1.0-mini/sample_data.json are missing.*"
        r"--key-frames-only",
    ):
        import_nuscenes(root, tmp_path / "out", cameras=list(dataset.cameras), settings=H264, progress=False)
    argv = [
        "import-nuscenes",
        str(root),
        str(tmp_path / "out"),
        "--key-frames-only",
        "--codec",
        "h264",
        "--scenes",
        "scene-0001",
        "--cameras",
        *dataset.cameras,
        "-q",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "1 scenes, 3 frames per camera (3 key frames); 3 files (3 encoded, 0 already done), 9 frames, " in printed
    assert printed.rstrip().endswith("keyframe stride 1 (the usual layout)")  # every frame is a key frame
    ann = np.load(tmp_path / "out" / "annotations" / "scene-0001.npz")
    assert ann["frame.is_key_frame"].all() and ann["frame.boxes.lengths"].tolist() == [2, 3, 2]
    again = import_nuscenes(
        root,
        tmp_path / "out",
        key_frames_only=True,
        scenes=["scene-0001"],
        cameras=list(dataset.cameras),
        settings=EncodeSettings(codec="h264"),
        progress=False,
    )
    assert (again.left_out, again.key_frames, again.encode.files_skipped) == (0, 3, 3)
    assert main(["import-nuscenes", str(root), str(tmp_path / "o2"), "--dataset-version", "v1.0-trainval", "-q"]) == 2
    assert "has no table folder 'v1.0-trainval' (found ['v1.0-mini'])" in capsys.readouterr().err


def test_bad_datasets_give_named_errors(dataset: FixtureInfo, tmp_path: Path) -> None:
    cams = list(dataset.cameras)
    with pytest.raises(DatasetImportError, match=r"does not exist; pass the folder that holds v1\.0-mini/"):
        import_nuscenes(tmp_path / "nowhere", tmp_path / "out", progress=False)
    with pytest.raises(ConfigurationError, match=r"scenes \['scene-9999'\] are not in v1.0-mini"):
        import_nuscenes(dataset.root, tmp_path / "out", scenes=["scene-9999"], cameras=cams, progress=False)
    with pytest.raises(ConfigurationError, match="must be a list of camera channels, not a string"):
        import_nuscenes(dataset.root, tmp_path / "out", cameras="CAM_FRONT", progress=False)  # type: ignore[arg-type]
    absent = (
        r"camera\(s\) \['CAM_BACK_LEFT', 'CAM_BACK_RIGHT', 'CAM_FRONT_RIGHT'\]; "
        r"the tables hold cameras \['CAM_BACK', "
    )
    with pytest.raises(DatasetImportError, match=f"has no sample_data for {absent}"):
        import_nuscenes(dataset.root, tmp_path / "out", progress=False)  # the fixture has three of the six
    broken = tmp_path / "broken"
    shutil.copytree(dataset.root / dataset.version, broken / dataset.version)
    (broken / dataset.version / "ego_pose.json").unlink()
    with pytest.raises(DatasetImportError, match=r"table '.*ego_pose.json' is missing; extract the full metadata"):
        import_nuscenes(broken, tmp_path / "out", cameras=cams, progress=False)
    (broken / dataset.version / "ego_pose.json").write_text('[{"token": ')
    with pytest.raises(DatasetImportError, match=r"ego_pose\.json' is not valid JSON"):
        import_nuscenes(broken, tmp_path / "out", cameras=cams, progress=False)
    (broken / dataset.version / "ego_pose.json").write_text(json.dumps([{"token": "x", "translation": [0, 0, 0]}]))
    with pytest.raises(DatasetImportError, match=r"record 0 \(token 'x'\) lacks field\(s\) \['rotation', 'timest"):
        import_nuscenes(broken, tmp_path / "out", cameras=cams, progress=False)
    (broken / dataset.version / "ego_pose.json").write_text("[]")
    with pytest.raises(
        DatasetImportError,
        match=r"ego_pose.json in .* has no record with token '[0-9a-f]+' "
        r"\(referenced by sample_data",
    ):
        import_nuscenes(broken, tmp_path / "out", cameras=cams, progress=False)


def test_annotation_files_load_with_the_annotation_reader(imported: NuScenesImport) -> None:
    files = pytest.importorskip("lightning_vstream.annotations")
    source = files.AnnotationFiles(imported.annotations)
    assert {"boxes", "labels", "instance_tokens"} <= set(source.ragged)
    clip = source.clip_annotations("scene-0001", ["CAM_FRONT", "CAM_BACK"])
    assert tuple(clip["intrinsics"].shape) == (2, 3, 3)
    frame = source.frame_annotations("scene-0001", 4, float("nan"), ["CAM_FRONT", "CAM_BACK"])
    assert tuple(frame["boxes"].shape) == (3, 9) and tuple(frame["ego_pose"].shape) == (4, 4)


def test_cycles_missed_by_any_camera_are_left_out_for_all(tmp_path: Path) -> None:
    from lightning_vstream.importers.nuscenes import scene_cycles
    from lightning_vstream.importers.nuscenes_tables import NuScenesTables

    # The first camera misses a key frame, another camera the leading sweep, a third the trailing one.
    drop = ((0, "CAM_BACK", 5), (0, "CAM_FRONT_LEFT", 0), (0, "CAM_FRONT", 10))
    info = write_nuscenes(tmp_path, scenes=1, drop=drop)
    tables = NuScenesTables.load(tmp_path, info.version)
    scene = tables.records("scene")[0]
    cycles, left_out = scene_cycles(tables, scene, info.cameras)
    kept = [j for j in range(info.cycles[0]) if j not in (0, 5, 10)]
    assert len(cycles) == len(kept) and left_out == 6
    # The sample whose key frame CAM_BACK lost is no key cycle; the two others are.
    assert [c.sample_token is not None for c in cycles] == [j in (1, 9) for j in kept]
    for cycle, j in zip(cycles, kept):
        assert [r["token"] for r in cycle.records] == [fixture_token("sample_data", 0, cam, j) for cam in info.cameras]
        times = [r["timestamp"] for r in cycle.records]
        assert max(times) - min(times) < 20_000  # one rig cycle: the cameras fire 7 ms apart
        assert cycle.records[0]["filename"].endswith(f"{times[0]}.jpg")
        assert all(r["is_key_frame"] == (j in (1, 9)) for r in cycle.records)
    key_only, left = scene_cycles(tables, scene, info.cameras, key_frames_only=True)
    assert len(key_only) == 2 and left == 2  # the two other cameras' key frames of the broken sample


def test_videos_take_the_key_frame_spacing_as_their_keyframe_stride(
    dataset: FixtureInfo, imported: NuScenesImport, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_vstream.index import is_reference

    # The fixture's key frames are 4 cycles apart (scene 1 drops a cycle, which moves its later ones).
    assert imported.keyframe_stride == 4
    index = load_index(imported.index)
    on_stride = 0
    for clip in index:
        keys = _annotations(imported, clip.clip_id)["frame.is_key_frame"]
        on_stride += sum(1 for i, key in enumerate(keys) if key and i % 4 == 0)
        for cam in clip.cameras:
            info = cam.info
            assert info is not None and info.references is not None
            last = (info.frame_count - 1) // 4 * 4
            assert [f for f in range(last + 1) if is_reference(info.references[f])] == list(range(0, last + 1, 4))
    assert imported.key_frames_on_stride == on_stride == 2
    # An explicit stride wins; 1 is the usual layout.
    usual = import_nuscenes(
        dataset.root,
        tmp_path / "usual",
        scenes=["scene-0000"],
        cameras=list(dataset.cameras),
        settings=EncodeSettings(codec="h264", keyframe_stride=1),
        progress=False,
    )
    assert usual.keyframe_stride == 1
    info = load_index(usual.index)[0].cameras[0].info
    assert info is not None and info.references is not None and all(is_reference(c) for c in info.references)
    # A stride from the data that the GOP does not fit is named, with both ways out.
    with pytest.raises(
        ConfigurationError,
        match=r"the key frames of these scenes are 4 frames apart, the keyframe stride the videos take unless told "
        r"otherwise: gop=6 is not a multiple of keyframe_stride=4: .* Or pass keyframe_stride=1 \(--keyframe-stride 1\)",
    ):
        import_nuscenes(
            dataset.root,
            tmp_path / "bad",
            cameras=list(dataset.cameras),
            settings=EncodeSettings(codec="h264", gop=6),
            progress=False,
        )
    argv = ["import-nuscenes", str(dataset.root), str(tmp_path / "cli"), "--codec", "h264", "--scenes", "scene-0000"]
    assert main([*argv, "--cameras", *dataset.cameras, "-q"]) == 0
    assert (
        "keyframe stride 4 (every 4th frame a reference picture; 0 of 3 key frames on the stride)"
        in capsys.readouterr().out
    )


@pytest.mark.parametrize(
    ("table", "field", "value", "expected"),
    [
        ("sample_data", "timestamp", "soon", "an integer (microseconds)"),
        ("sample", "timestamp", 1.5, "an integer (microseconds)"),
        ("sample_data", "is_key_frame", "yes", "true or false"),
        ("ego_pose", "rotation", [1, 0, 0], "a list of 4 numbers"),
        ("calibrated_sensor", "translation", None, "a list of 3 numbers"),
        ("calibrated_sensor", "camera_intrinsic", [[1, 0], [0, 1]], "a 3x3 list of numbers"),
        ("sample_annotation", "size", [1, 2, "3"], "a list of 3 numbers"),
        ("sample_data", "sample_token", 7, "a string"),
        ("sample_data", "filename", "../../../etc/passwd", "a path relative to the dataroot, inside it"),
        ("sample_data", "filename", "/etc/passwd", "a path relative to the dataroot, inside it"),
        ("sample_data", "filename", "samples/../../outside.jpg", "a path relative to the dataroot, inside it"),
    ],
)
def test_a_field_of_the_wrong_type_or_place_is_named(
    dataset: FixtureInfo,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    table: str,
    field: str,
    value: Any,
    expected: str,
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(dataset.root / dataset.version, broken / dataset.version)
    path = broken / dataset.version / f"{table}.json"
    rows = json.loads(path.read_text())
    rows[1][field] = value
    path.write_text(json.dumps(rows))
    where = f"{str(path)!r} record 1 (token {rows[1]['token']!r}) field {field!r} holds {value!r}; expected {expected}"
    with pytest.raises(DatasetImportError) as caught:
        import_nuscenes(broken, tmp_path / "out", cameras=list(dataset.cameras), progress=False)
    assert where in str(caught.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.mp4"))
    argv = ["import-nuscenes", str(broken), str(tmp_path / "cli"), "--cameras", *dataset.cameras, "-q"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("vstream import-nuscenes: error: nuScenes table ") and where in err
