"""miles.rollout.rm_hub: --custom-rm-path first, else an exact-match rule reward."""

import asyncio

from miles.utils.misc import load_function


async def async_rm(args, sample, **kwargs):
    if args.custom_rm_path is not None:
        return await load_function(args.custom_rm_path)(args, sample, **kwargs)
    return 1.0 if sample.label is not None and sample.label in sample.response else 0.0


async def batched_async_rm(args, samples, inplace_set_reward_field=False, **kwargs):
    if inplace_set_reward_field:
        rewards = await batched_async_rm(args, samples, **kwargs)
        for sample, reward in zip(samples, rewards, strict=True):
            assert sample.reward is None
            sample.reward = reward
        return None
    if args.custom_rm_path is not None:
        return await load_function(args.custom_rm_path)(args, samples, **kwargs)
    return await asyncio.gather(*(async_rm(args, sample, **kwargs) for sample in samples))
