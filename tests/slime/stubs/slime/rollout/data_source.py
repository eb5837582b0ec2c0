"""slime.rollout.data_source: the DataSource contract over an in-memory prompt list."""

import copy

from slime.utils.types import Sample


class DataSource:
    def __init__(self, args, prompts):
        self.args = args
        self.prompts = list(prompts)
        self.offset = 0
        self.buffer = []

    def get_samples(self, num_samples):
        groups = []
        while self.buffer and len(groups) < num_samples:
            groups.append(self.buffer.pop(0))
        for _ in range(num_samples - len(groups)):
            prompt, label = self.prompts[self.offset % len(self.prompts)]
            group = []
            for _ in range(self.args.n_samples_per_prompt):
                sample = Sample(prompt=prompt, label=label, index=self.offset, group_index=self.offset)
                group.append(copy.deepcopy(sample))
            groups.append(group)
            self.offset += 1
        return groups

    def add_samples(self, samples):
        self.buffer.extend(samples)

    def save(self, rollout_id):
        pass

    def load(self, rollout_id=None):
        pass

    def __len__(self):
        return len(self.prompts)
