"""A NeMo Gym resources server for the contract suite: the reward is the fraction of digits in
the answer, which even the tiny untrained model of cwtrain-local earns sometimes (so GRPO sees
advantages that are not all zero). Gym starts it from this directory (``entrypoint: app.py``)."""

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)


class DigitsConfig(BaseResourcesServerConfig):
    pass


class DigitsVerifyResponse(BaseVerifyResponse):
    digits: int = 0
    characters: int = 0


class DigitsResourcesServer(SimpleResourcesServer):
    config: DigitsConfig

    async def verify(self, body: BaseVerifyRequest) -> DigitsVerifyResponse:
        text = body.response.output_text or ""
        digits = sum(ch.isdigit() for ch in text)
        reward = digits / len(text) if text else 0.0
        return DigitsVerifyResponse(**body.model_dump(), reward=reward, digits=digits, characters=len(text))


if __name__ == "__main__":
    DigitsResourcesServer.run_webserver()
