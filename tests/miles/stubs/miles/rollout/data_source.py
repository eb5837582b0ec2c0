"""miles.rollout.data_source.DataSource over an in-memory prompt list."""

import copy

from miles.utils.types import Sample


class DataSource:
    def __init__(self, args, prompts):
        self.args = args
        self.prompts = list(prompts)
        self.offset = 0
        self.added = []

    def get_samples(self, num_samples):
        groups = []
        for _ in range(num_samples):
            prompt, label = self.prompts[self.offset % len(self.prompts)]
            sample = Sample(prompt=prompt, label=label, index=self.offset, group_index=self.offset)
            groups.append([copy.deepcopy(sample) for _ in range(self.args.n_samples_per_prompt)])
            self.offset += 1
        return groups

    def add_samples(self, samples):
        self.added.extend(samples)

    def save(self, rollout_id):
        pass

    def load(self, rollout_id=None):
        pass

    def __len__(self):
        return len(self.prompts)
