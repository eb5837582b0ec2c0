"""miles' rule for loading and calling --rollout-function-path."""

import asyncio
import inspect

from miles.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from miles.utils.misc import load_function


class LegacyRolloutFnAdapter:
    def __init__(self, input, fn):
        self.args = input.args
        self.data_source = input.data_source
        self.fn = fn

    def __call__(self, input):
        output = self.fn(self.args, input.rollout_id, self.data_source, evaluation=input.evaluation)
        if not isinstance(output, (RolloutFnTrainOutput, RolloutFnEvalOutput)):
            output = RolloutFnEvalOutput(data=output) if input.evaluation else RolloutFnTrainOutput(samples=output)
        return output


def load_rollout_function(input, path):
    fn = load_function(path)
    if inspect.isclass(fn):
        return fn(input)
    return LegacyRolloutFnAdapter(input, fn)


def call_rollout_function(fn, input):
    output = fn(input)
    if inspect.iscoroutine(output):
        output = asyncio.run(output)
    return output
