"""The legacy ClientApp: ``client_fn`` answering every legacy call, and the two vintages
answering each other's messages (docs/from-flower.md, "The legacy API: the client side")."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
import pytest

from fedcore.domain import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    Metadata,
    MetricRecord,
    RecordDict,
)
from fedcore.domain.message import assemble_message
from fedcore.legacy import conversion
from fedcore.legacy.client import Client
from fedcore.legacy.client_app import ClientApp
from fedcore.legacy.numpy_client import NumPyClient
from fedcore.legacy.types import (
    Code,
    EvaluateIns,
    FitIns,
    GetParametersIns,
    GetPropertiesIns,
    NDArrays,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)

NODE_ID = 7


def delivered(message_type: str, content: RecordDict) -> Message:
    """A message as a node receives it, of any type (the legacy ones included)."""
    metadata = Metadata(
        run_id=3, message_id="m1", src_node_id=1, dst_node_id=NODE_ID, message_type=message_type
    )
    return assemble_message(metadata, content=content)


@pytest.fixture
def context() -> Context:
    return Context(run_id=3, node_id=NODE_ID, node_config={"partition-id": 2})


class Doubling(NumPyClient):
    """Doubles the arrays it is sent; evaluates to their sum."""

    def __init__(self, name: str = "") -> None:
        self.name = name

    def get_properties(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        return {"name": self.name, "asked": str(config.get("what"))}

    def get_parameters(self, config: dict[str, Scalar]) -> NDArrays:
        return [np.arange(3.0)]

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        factor = float(config["factor"])
        metrics: dict[str, Scalar] = {"seen": len(parameters), "ok": True, "who": self.name}
        return [p * factor for p in parameters], 10, metrics

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        return float(sum(p.sum() for p in parameters)), 5, {"acc": 0.5}


def legacy_fit(arrays: NDArrays, factor: float = 2.0) -> Message:
    fitins = FitIns(ndarrays_to_parameters(arrays), {"factor": factor})
    return delivered("train", conversion.fitins_to_recorddict(fitins, keep_input=True))


def message_api(message_type: str, arrays: dict[str, np.ndarray], **config: Any) -> Message:
    content = RecordDict({"arrays": ArrayRecord(arrays), "config": ConfigRecord(config)})
    return delivered(message_type, content)


# ---- client_fn answering the legacy server's calls


def test_a_numpy_client_answers_a_legacy_fit_as_flower_maps_it(context: Context) -> None:
    app = ClientApp(client_fn=lambda context: Doubling("a").to_client())

    reply = app(legacy_fit([np.ones(2), np.full(3, 2.0)]), context)

    fitres = conversion.recorddict_to_fitres(reply.content, keep_input=True)
    assert fitres.status.code is Code.OK
    assert fitres.num_examples == 10
    assert fitres.metrics == {"seen": 2, "ok": True, "who": "a"}
    doubled = parameters_to_ndarrays(fitres.parameters)
    np.testing.assert_array_equal(doubled[0], np.full(2, 2.0))
    np.testing.assert_array_equal(doubled[1], np.full(3, 4.0))
    assert reply.metadata.reply_to_message_id == "m1"


def test_evaluate_get_properties_and_get_parameters(context: Context) -> None:
    app = ClientApp(client_fn=lambda context: Doubling("b").to_client())
    evaluateins = EvaluateIns(ndarrays_to_parameters([np.ones(4)]), {})

    evaluated = app(
        delivered("evaluate", conversion.evaluateins_to_recorddict(evaluateins, True)), context
    )
    properties = app(
        delivered(
            "get_properties",
            conversion.getpropertiesins_to_recorddict(GetPropertiesIns({"what": "x"})),
        ),
        context,
    )
    parameters = app(
        delivered(
            "get_parameters", conversion.getparametersins_to_recorddict(GetParametersIns({}))
        ),
        context,
    )

    evaluateres = conversion.recorddict_to_evaluateres(evaluated.content)
    assert (evaluateres.loss, evaluateres.num_examples, evaluateres.metrics) == (
        4.0,
        5,
        {"acc": 0.5},
    )
    assert conversion.recorddict_to_getpropertiesres(properties.content).properties == {
        "name": "b",
        "asked": "x",
    }
    got = conversion.recorddict_to_getparametersres(parameters.content, keep_input=True)
    np.testing.assert_array_equal(parameters_to_ndarrays(got.parameters)[0], np.arange(3.0))


def test_a_method_the_client_lacks_answers_not_implemented(context: Context) -> None:
    class OnlyFit(NumPyClient):
        def fit(
            self, parameters: NDArrays, config: dict[str, Scalar]
        ) -> tuple[NDArrays, int, dict[str, Scalar]]:
            return parameters, 1, {}

    app = ClientApp(client_fn=lambda context: OnlyFit().to_client())
    evaluateins = EvaluateIns(ndarrays_to_parameters([np.ones(1)]), {})

    reply = app(
        delivered("evaluate", conversion.evaluateins_to_recorddict(evaluateins, True)), context
    )

    status = conversion.recorddict_to_evaluateres(reply.content).status
    assert status.code is Code.EVALUATE_NOT_IMPLEMENTED
    assert status.message == "Client does not implement `evaluate`"


def test_a_returned_numpy_client_is_converted_with_one_warning(
    context: Context, caplog: pytest.LogCaptureFixture
) -> None:
    app = ClientApp(client_fn=lambda context: Doubling())

    with caplog.at_level(logging.WARNING, logger="flwr"):
        first = app(legacy_fit([np.ones(1)]), context)
        app(legacy_fit([np.ones(1)]), context)

    assert conversion.recorddict_to_fitres(first.content, True).num_examples == 10
    warnings = [r for r in caplog.records if "NumpyClient` was returned" in r.getMessage()]
    assert len(warnings) == 1


def test_the_client_sees_the_messages_context(context: Context) -> None:
    seen: list[Context] = []

    class Remembering(Client):
        def get_properties(self, ins: GetPropertiesIns) -> Any:
            seen.append(self.context)
            return Client.get_properties(self, ins)

    class NumPyRemembering(Doubling):
        def get_properties(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
            seen.append(self.context)
            return {}

    message = delivered(
        "get_properties", conversion.getpropertiesins_to_recorddict(GetPropertiesIns({}))
    )
    ClientApp(client_fn=lambda context: Remembering())(message, context)
    ClientApp(client_fn=lambda context: NumPyRemembering().to_client())(message, context)

    assert seen == [context, context]


def test_the_older_client_fn_of_a_cid_gets_the_partition_id(
    context: Context, caplog: pytest.LogCaptureFixture
) -> None:
    cids: list[str] = []

    def client_fn(cid: str) -> Client:
        cids.append(cid)
        return Doubling(cid).to_client()

    with caplog.at_level(logging.WARNING, logger="flwr"):
        app = ClientApp(client_fn=client_fn)
    reply = app(legacy_fit([np.ones(1)]), context)
    no_partition = Context(run_id=3, node_id=NODE_ID)
    app(legacy_fit([np.ones(1)]), no_partition)

    assert cids == ["2", str(NODE_ID)]
    assert conversion.recorddict_to_fitres(reply.content, True).metrics["who"] == "2"
    assert any("DEPRECATED FEATURE" in r.getMessage() for r in caplog.records)


def test_a_client_fn_of_a_str_annotated_parameter_is_the_older_form(context: Context) -> None:
    def client_fn(node: str) -> Client:
        return Doubling(node).to_client()

    reply = ClientApp(client_fn)(legacy_fit([np.ones(1)]), context)

    assert conversion.recorddict_to_fitres(reply.content, True).metrics["who"] == "2"


def test_client_fn_of_another_signature_and_decorators_beside_it_are_refused() -> None:
    with pytest.raises(ValueError, match="def client_fn\\(context: Context\\)"):
        ClientApp(client_fn=lambda a, b: Doubling())
    app = ClientApp(client_fn=lambda context: Doubling())
    for register in (app.train, app.evaluate, app.query):
        with pytest.raises(ValueError, match="or `client_fn`, but not both"):
            register()


def test_mods_wrap_a_client_fns_answers(context: Context) -> None:
    calls: list[str] = []

    def mod(msg: Message, ctx: Context, call_next: Any) -> Message:
        calls.append(msg.metadata.message_type)
        reply: Message = call_next(msg, ctx)
        calls.append("after")
        return reply

    app = ClientApp(client_fn=lambda context: Doubling().to_client(), mods=[mod])

    reply = asyncio.run(app.handle(legacy_fit([np.ones(1)]), context, in_thread=True))

    assert not reply.has_error()
    assert calls == ["train", "after"]


def test_a_failing_client_is_an_error_reply(context: Context) -> None:
    class Broken(NumPyClient):
        def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> Any:
            return parameters, 1  # two values, not three

    app = ClientApp(client_fn=lambda context: Broken().to_client())

    reply = asyncio.run(app.handle(legacy_fit([np.ones(1)]), context, in_thread=False))

    assert reply.has_error()
    assert "NumPyClient.fit must return a tuple of 3" in reply.error.reason


def test_the_app_is_found_again_by_its_client_fns_module() -> None:
    app = ClientApp(client_fn=lambda context: Doubling())

    assert app.defining_modules[0] == __name__


# ---- a legacy client under a Message-API strategy


def test_a_legacy_client_answers_a_message_api_train_in_its_shape(context: Context) -> None:
    app = ClientApp(client_fn=lambda context: Doubling("c").to_client())

    reply = app(message_api("train", {"w": np.ones(2), "b": np.zeros(1)}, factor=3.0), context)

    content = reply.content
    assert sorted(content) == ["arrays", "metrics", "other-metrics"]
    assert list(content["arrays"]) == ["w", "b"]
    np.testing.assert_array_equal(content["arrays"]["w"], np.full(2, 3.0))
    assert content["metrics"] == MetricRecord({"seen": 2, "num-examples": 10})
    assert content["other-metrics"] == ConfigRecord({"ok": True, "who": "c"})


def test_a_legacy_client_answers_a_message_api_evaluate_in_its_shape(context: Context) -> None:
    app = ClientApp(client_fn=lambda context: Doubling().to_client())

    reply = app(message_api("evaluate", {"w": np.full(2, 1.5)}), context)

    assert sorted(reply.content) == ["metrics"]
    assert reply.content["metrics"] == MetricRecord({"acc": 0.5, "loss": 3.0, "num-examples": 5})


def test_a_legacy_client_without_fit_is_an_error_reply_to_the_message_api(
    context: Context,
) -> None:
    app = ClientApp(client_fn=lambda context: NumPyClient().to_client())

    reply = asyncio.run(
        app.handle(message_api("train", {"w": np.ones(1)}, factor=1.0), context, in_thread=False)
    )

    assert reply.has_error()
    assert "FIT_NOT_IMPLEMENTED" in reply.error.reason


# ---- a Message-API ClientApp under the legacy server


def message_api_app() -> ClientApp:
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        arrays = msg.content["arrays"]
        assert list(arrays) == ["0", "1"]
        factor = msg.content["config"]["factor"]
        assert isinstance(factor, float)
        doubled = ArrayRecord({key: arrays[key] * factor for key in arrays})
        metrics = MetricRecord({"num-examples": 8, "mse": 0.25})
        return Message(RecordDict({"arrays": doubled, "metrics": metrics}), reply_to=msg)

    @app.evaluate()
    async def evaluate(msg: Message, context: Context) -> Message:
        metrics = MetricRecord({"num-examples": 4, "eval_loss": 1.25, "acc": 0.75})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    return app


def test_a_message_api_handler_answers_a_legacy_fit(context: Context) -> None:
    reply = message_api_app()(legacy_fit([np.ones(2), np.arange(3.0)], factor=2.0), context)

    fitres = conversion.recorddict_to_fitres(reply.content, keep_input=True)
    assert fitres.status.code is Code.OK
    assert (fitres.num_examples, fitres.metrics) == (8, {"mse": 0.25})
    arrays = parameters_to_ndarrays(fitres.parameters)
    np.testing.assert_array_equal(arrays[1], np.arange(3.0) * 2)
    assert reply.metadata.reply_to_message_id == "m1"


def test_an_async_message_api_handler_answers_a_legacy_evaluate(context: Context) -> None:
    evaluateins = EvaluateIns(ndarrays_to_parameters([np.ones(1)]), {})
    message = delivered("evaluate", conversion.evaluateins_to_recorddict(evaluateins, True))

    reply = asyncio.run(message_api_app().handle(message, context, in_thread=False))

    evaluateres = conversion.recorddict_to_evaluateres(reply.content)
    assert (evaluateres.loss, evaluateres.num_examples) == (1.25, 4)
    assert evaluateres.metrics == {"acc": 0.75}


def test_a_message_api_handler_still_gets_message_api_messages_as_they_are(
    context: Context,
) -> None:
    reply = message_api_app()(
        message_api("train", {"0": np.ones(1), "1": np.ones(1)}, factor=1.0), context
    )

    assert sorted(reply.content) == ["arrays", "metrics"]


def test_a_legacy_evaluate_reply_without_a_loss_is_an_error_reply(context: Context) -> None:
    app = ClientApp()

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)

    evaluateins = EvaluateIns(ndarrays_to_parameters([np.ones(1)]), {})
    message = delivered("evaluate", conversion.evaluateins_to_recorddict(evaluateins, True))
    reply = asyncio.run(app.handle(message, context, in_thread=False))

    assert reply.has_error()
    assert "needs a loss" in reply.error.reason
