"""A worker process for the crash test: scores every step event, slowly, on a real broker.

usage: score_worker.py BOOTSTRAP IN_TOPIC OUT_TOPIC DLQ_TOPIC GROUP
"""

from __future__ import annotations

import sys
import time

from streams.config import KafkaSettings
from streams.kafka import KafkaBus
from streams.processor import Output, StreamProcessor
from streams.records import Score, StepEvent


def main() -> None:
    bootstrap, src, out, dlq, group = sys.argv[1:6]
    bus = KafkaBus(KafkaSettings(bootstrap_servers=bootstrap, client_id="crash-worker"))

    def handle(event: StepEvent, _msg: object) -> list[Output]:
        time.sleep(0.03)  # slow enough (9 s for the stream) that a kill lands mid-stream
        score = Score(
            trajectory_id=event.trajectory_id, step_id=event.step.step_id, tier=0, score=0.5
        )
        return [Output(out, score, key=event.trajectory_id, idempotency_key=score.idempotency_key)]

    StreamProcessor(bus, {src: StepEvent}, group, handle, deadletter_topic=dlq, batch_size=7).run(
        idle_timeout_s=4.0
    )
    bus.close()


if __name__ == "__main__":
    main()
