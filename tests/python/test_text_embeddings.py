"""Text through the sandbox: all-MiniLM-L6-v2 served by Plinth (tokenizer and
pooling in the `text-embedding` plugin, the encoder in ONNX Runtime and
libtorch) against sentence-transformers' embeddings of the same sentences
(written by `make setup` into .cache/minilm/reference.json), its token ids
against the Python `tokenizers` library's, OpenAI's `openai` client against
/v1/embeddings and /v1/models, and the spam classifier composed over the
encoder."""

import json
import urllib.error
import urllib.request

import numpy as np
import onnxruntime
import openai
import pytest
import tokenizers

from conftest import ROOT, Plinth

REFERENCE = json.loads((ROOT / ".cache/minilm/reference.json").read_text())
SENTENCES = (ROOT / "tests/fixtures/sentences.txt").read_text().splitlines()
ENCODERS = ["minilm", "minilm_torchscript"]
MIN_COSINE = 0.9999


@pytest.fixture(scope="module")
def server():
    server = Plinth(ROOT / "model_repository", "--model-control-mode", "explicit",
                    *[flag for m in [*ENCODERS, "spam_classifier", "ocr_cls"] for flag in ("--load-model", m)])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://{server.url}/v1", api_key="not-checked", max_retries=0)


def post(server, path, body, content_type="application/json"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{server.url}{path}", data=data, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def cosines(vectors, expected):
    a, b = np.asarray(vectors, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_the_reference_is_of_the_committed_sentences():
    assert REFERENCE["sentences"] == SENTENCES and len(SENTENCES) == 50


@pytest.mark.parametrize("model", ENCODERS)
def test_embeddings_equal_sentence_transformers_in_one_batch_and_one_by_one(server, model):
    status, answer = post(server, f"/v2/models/{model}/predict", {"input": SENTENCES})
    assert status == 200, answer
    assert [item["index"] for item in answer["data"]] == list(range(50))
    batched = [item["embedding"] for item in answer["data"]]
    assert all(len(v) == 384 for v in batched)
    assert cosines(batched, REFERENCE["embeddings"]).min() >= MIN_COSINE
    alone = []
    for sentence in SENTENCES:
        status, answer = post(server, f"/v2/models/{model}/predict", sentence.encode(), "text/plain; charset=utf-8")
        assert status == 200, answer
        alone.append(answer["data"][0]["embedding"])
    assert cosines(alone, REFERENCE["embeddings"]).min() >= MIN_COSINE
    assert np.allclose(np.linalg.norm(alone, axis=1), 1.0, atol=1e-5), "unit vectors"


def test_token_ids_equal_the_python_tokenizers_library(server):
    tokenizer = tokenizers.Tokenizer.from_file(str(ROOT / "model_repository/minilm/1/tokenizer.json"))
    tokenizer.no_padding()  # the file pads to 128; Plinth pads to its length buckets instead
    long_text = " ".join(SENTENCES)  # past the file's truncation at 128 tokens
    texts = [*SENTENCES, long_text]
    status, answer = post(server, "/v2/models/minilm/predict?token_ids=true", {"input": texts})
    assert status == 200, answer
    expected = [e.ids for e in tokenizer.encode_batch(texts)]
    assert [item["token_ids"] for item in answer["data"]] == expected
    assert len(expected[-1]) == 128, "the long text is truncated as the file says"
    assert answer["usage"] == {"prompt_tokens": sum(map(len, expected)), "total_tokens": sum(map(len, expected))}


def test_openai_client_embeds_one_text_and_a_batch_of_16(client):
    one = client.embeddings.create(model="minilm", input=SENTENCES[0])
    assert one.model == "minilm" and len(one.data) == 1
    assert cosines([one.data[0].embedding], REFERENCE["embeddings"][:1]).min() >= MIN_COSINE
    batch = client.embeddings.create(model="minilm", input=SENTENCES[10:26])
    assert [d.index for d in batch.data] == list(range(16))
    assert cosines([d.embedding for d in batch.data], REFERENCE["embeddings"][10:26]).min() >= MIN_COSINE
    assert batch.usage.prompt_tokens == batch.usage.total_tokens > 16
    # The client asks for base64 unless told; floats come back the same.
    floats = client.embeddings.create(model="minilm_torchscript", input=SENTENCES[10:26], encoding_format="float")
    assert cosines([d.embedding for d in floats.data], REFERENCE["embeddings"][10:26]).min() >= MIN_COSINE


def test_openai_client_gets_a_clear_error_for_an_unknown_model(client):
    with pytest.raises(openai.NotFoundError) as raised:
        client.embeddings.create(model="no-such-model", input="hello")
    error = raised.value.body
    assert raised.value.status_code == 404
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "no-such-model" in error["message"] and error["type"] == "invalid_request_error"
    # A model that exists but does not opt in is not an embedding model.
    with pytest.raises(openai.NotFoundError) as raised:
        client.embeddings.create(model="ocr_cls", input="hello")
    assert "openai.embeddings" in raised.value.body["message"]


def test_fields_plinth_does_not_implement_are_refused_by_name(client, server):
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(model="minilm", input="hello", dimensions=64)
    assert raised.value.body["param"] == "dimensions" and "'dimensions'" in raised.value.body["message"]
    status, answer = post(server, "/v1/embeddings", {"model": "minilm", "input": [[101, 102]]})
    assert status == 400 and "token-id input is not supported" in answer["error"]["message"], answer
    assert answer["error"]["param"] == "input"
    status, answer = post(server, "/v1/embeddings", {"model": "minilm", "input": "a", "temperature": 0})
    assert status == 400 and "'temperature'" in answer["error"]["message"], answer
    status, answer = post(server, "/v2/models/minilm/predict", {"input": ["x"] * 65})
    assert status == 400 and "at most 64" in answer["error"], answer


def test_v1_models_lists_the_models_that_opt_in(client):
    assert sorted(m.id for m in client.models.list()) == ENCODERS
    assert client.models.retrieve("minilm").owned_by == "plinth"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("spam_classifier")


def test_the_classifier_answers_the_test_set_through_predict(server):
    rows = [line.split("\t", 1) for line in (ROOT / "tests/fixtures/spam_test.tsv").read_text().splitlines()]
    answers = []
    for label, text in rows:
        status, answer = post(server, "/v2/models/spam_classifier/predict", text.encode(), "text/plain")
        assert status == 200, answer
        assert set(answer) == {"label", "score"} and 0.5 <= answer["score"] <= 1.0
        answers.append(answer)
    correct = sum(answer["label"] == label for answer, (label, _) in zip(answers, rows))
    # 19 of 20: "The doctor said the results look fine, nothing to worry about." reads as spam (0.54).
    assert correct / len(rows) >= 0.95, answers
    # The composition is the head run on the encoder's embedding.
    _, text = rows[0]
    _, embedded = post(server, "/v2/models/minilm/predict", {"input": text})
    head = onnxruntime.InferenceSession(str(ROOT / "model_repository/spam_classifier/1/model.onnx"))
    probabilities = head.run(None, {"embedding": np.array([embedded["data"][0]["embedding"]], np.float32)})[0][0]
    assert answers[0]["score"] == pytest.approx(float(probabilities.max()), abs=1e-6)
    status, answer = post(server, "/v2/models/spam_classifier/predict", {"input": text})
    assert (status, answer) == (200, answers[0])
