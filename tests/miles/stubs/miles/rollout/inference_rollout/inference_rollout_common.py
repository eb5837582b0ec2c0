"""miles' GenerateState and InferenceRolloutFn, reduced to what cwtrain's subclass relies on.

The semaphore is sized exactly as miles sizes it: zero without local rollout GPUs.
"""

import asyncio


class _CharTokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 50 + 2 for c in text]

    def decode(self, ids, **kwargs):
        return "".join(chr(i) for i in ids)


class GenerateState:
    def __init__(self, args):
        self.args = args
        self.tokenizer = _CharTokenizer()
        self.generate_fn_semaphore = asyncio.Semaphore(
            args.sglang_server_concurrency * args.rollout_num_gpus // args.rollout_num_gpus_per_engine
        )
        self.aborted = False


class InferenceRolloutFn:
    def __init__(self, input):
        self.data_source = input.data_source
        self.state = GenerateState(input.args)
        self.eval_prompt_dataset_cache = {}

    async def __call__(self, input):
        if input.evaluation:
            return await self._call_eval(input)
        return await self._call_train(input)

    async def _call_train(self, input):
        async with self.state.generate_fn_semaphore:  # miles' generate path: hangs at zero slots
            raise AssertionError("the base class generates through local SGLang engines")

    async def _call_eval(self, input):
        raise AssertionError("not used")
