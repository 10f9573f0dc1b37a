"""The conversation items a client handles itself: ``conversation.item.create`` (text, or
audio in the session's input format), ``.truncate`` (a spoken answer cut to what was
played), ``.delete`` and ``.retrieve``.

:class:`Items` is handed what it calls: the transcriber (a spoken item is transcribed as a
committed turn is), the replies (an answer in progress is cancelled when truncated), and the
ids the session announced for turns not in the conversation yet."""

from __future__ import annotations

import base64
import binascii
from typing import Awaitable, Callable

from omnictl.audio import float_to_pcm16_bytes, pcm16_to_float
from omnictl.serving.common.echo import clip_repr
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.formats import PCM
from omnictl.serving.realtime.session.context import SessionContext
from omnictl.serving.realtime.session.replies import Replies
from omnictl.serving.realtime.session.transcripts import Transcriber
from omnictl.serving.realtime.turns import Turn

ALLOWED = {  # the content types each role's item takes
    "user": ("input_text", "input_audio"),
    "system": ("input_text",),
    "assistant": ("output_text", "output_audio"),
}
# The fields a part of each type would have ignored: refused instead, naming them. (An
# assistant's audio cannot be taken, as OpenAI's server cannot: its transcript stands for it;
# an input_audio's transcript would not be what the model hears, which is its audio's.)
IGNORED = {
    "input_text": ("audio",),
    "output_text": ("audio",),
    "output_audio": ("audio",),
    "input_audio": ("text", "transcript"),
}
ROOT = "root"  # previous_item_id: the new item goes first


class Items:
    def __init__(
        self,
        ctx: SessionContext,
        transcriber: Transcriber,
        replies: Replies,
        open_turn: Callable[[], str | None],
        buffered: Callable[[], int],
        cancel: Callable[[str], Awaitable[None]],
    ) -> None:
        self.ctx = ctx
        self.transcriber = transcriber
        self.replies = replies
        self._open_turn = open_turn  # the user turn open (speech started), not committed yet
        self._buffered = buffered  # bytes in the input buffer (the session's memory bound counts them)
        self._cancel = cancel  # cancel the response in progress (as response.cancel does)

    async def item_create(self, event: ev.ConversationItemCreate) -> None:
        item, where, refuse = event.item, "item.content", ev.Refusal(event.event_id)
        allowed = ALLOWED[item.role]
        if len(item.content) != 1:
            raise refuse(f"{where} must hold exactly one part, got {len(item.content)}", param=where)
        part = item.content[0]
        if part.type not in allowed:
            raise refuse(
                f"{where}[0].type: a {item.role} item takes {', '.join(allowed)}, got {part.type!r}",
                param=f"{where}[0].type",
            )
        for name in IGNORED[part.type]:
            if getattr(part, name) is not None:
                raise refuse(
                    f"{where}[0].{name}: a {part.type} part takes no {name}; leave it out", param=f"{where}[0].{name}"
                )
        previous = self.ctx.conversation.last_id()
        anchor = event.previous_item_id  # where the item goes: after it ('root': first); None: last
        if anchor is not None and anchor != ROOT and self.ctx.conversation.find(anchor) is None:
            raise refuse(
                f"previous_item_id {clip_repr(anchor, 64)} is not an item of the conversation",
                "item_not_found",
                "previous_item_id",
            )
        if anchor is not None:
            previous = None if anchor == ROOT else anchor
        if item.id is not None and self.ctx.conversation.find(item.id) is not None:
            raise refuse(f"item.id {clip_repr(item.id, 64)} is already in the conversation", param="item.id")
        if item.id is not None and item.id in self._ids_announced():
            # The turn being spoken (or transcribed) commits under this id later: two items of one id.
            raise refuse(
                f"item.id {clip_repr(item.id, 64)} is taken: the session announced it for a turn of the input "
                "audio (input_audio_buffer.speech_started, or a transcription under way); give another id",
                param="item.id",
            )
        if part.type == "input_audio":
            codec = self.ctx.settings.input_codec
            try:
                raw = base64.b64decode(part.audio or "", validate=True)
            except (binascii.Error, ValueError) as exc:
                raise refuse(
                    f"{where}[0].audio is not valid base64 ({exc})", "invalid_base64", f"{where}[0].audio"
                ) from exc
            limit = self.ctx.state.limits.max_realtime_buffer_bytes * codec.bytes_per_second // PCM.bytes_per_second
            if len(raw) < 2 or len(raw) % codec.sample_bytes or len(raw) > limit:
                raise refuse(
                    f"{where}[0].audio must be {codec.type} at {codec.rate} Hz (the session's input format), up to "
                    f"{limit} bytes, got {len(raw)} bytes",
                    "invalid_audio",
                    f"{where}[0].audio",
                )
            raw = codec.to_pcm16(raw)
            self.ctx.check_memory(self._buffered(), len(raw) * 2, event.event_id)
            turn = self._placed(self.ctx.conversation.user_audio(pcm16_to_float(raw), item.id), anchor)
            self.ctx.send(ev.ItemAdded(item=turn.item(), previous_item_id=previous))
            self.transcriber.transcribe(turn)
            return
        text = part.text if part.text is not None else part.transcript
        turn = self._placed(self.ctx.conversation.text(item.role, text or "", item.id), anchor)
        turn.spoken = part.type == "output_audio"
        self.ctx.send(ev.ItemAdded(item=turn.item(), previous_item_id=previous))
        self.ctx.send(ev.ItemDone(item=turn.item(), previous_item_id=previous))

    def _ids_announced(self) -> set[str]:
        """The ids the session told the client of and will add (or holds) outside the
        conversation: the turn speech started, the turn transcribed live or preemptively
        answered, and spoken items still being transcribed (one may have been deleted)."""
        ids = {turn.id for turn in self.ctx.transcribing.values()}
        for announced in (self._open_turn(), self.transcriber.live, self.replies.early):
            if isinstance(announced, str):
                ids.add(announced)
            elif announced is not None:
                ids.add(announced.item_id)
        return ids

    def _placed(self, turn: Turn, anchor: str | None) -> Turn:
        """``turn`` (added last) moved to just after the item ``anchor`` (first for 'root')."""
        turns = self.ctx.conversation.turns
        if anchor is None or turn not in turns:  # not in: dropped at once by the size limit
            return turn
        turns.remove(turn)
        after = self.ctx.conversation.find(anchor) if anchor != ROOT else None
        turns.insert(turns.index(after) + 1 if after is not None else 0, turn)
        return turn

    def _item(self, item_id: str, event_id: str | None, verb: str) -> Turn:
        turn = self.ctx.conversation.find(item_id)
        if turn is None:
            raise ev.Refusal(event_id)(
                f"conversation.item.{verb}: no item {clip_repr(item_id, 64)} in the conversation",
                "item_not_found",
                "item_id",
            )
        return turn

    async def item_truncate(self, event: ev.ConversationItemTruncate) -> None:
        """Cut a spoken answer to what the client played: the next response hears only those words."""
        refuse = ev.Refusal(event.event_id)
        turn = self._item(event.item_id, event.event_id, "truncate")
        if turn.role != "assistant" or not turn.spoken:
            raise refuse(
                f"conversation.item.truncate: item {turn.id} is not an assistant audio message; only those "
                "can be truncated",
                param="item_id",
            )
        if event.content_index != 0:
            raise refuse(
                f"conversation.item.truncate: content_index must be 0 (an item has one part), got "
                f"{event.content_index}",
                param="content_index",
            )
        response = self.replies.response
        if response is not None and response[0].turn is turn:
            await self._cancel(response[0].id)  # the client stopped playing it: no more of it is wanted
        if not 0 <= event.audio_end_ms <= turn.audio_ms + 1:
            raise refuse(
                f"conversation.item.truncate: audio_end_ms {event.audio_end_ms} is outside the item's audio "
                f"(0 to {turn.audio_ms:.0f} ms)",
                param="audio_end_ms",
            )
        turn.truncate(event.audio_end_ms)
        self.replies.echo.stop()  # the client stopped playing it
        self.ctx.send(ev.ItemTruncated(item_id=turn.id, content_index=0, audio_end_ms=event.audio_end_ms))

    async def item_delete(self, event: ev.ConversationItemDelete) -> None:
        turn = self._item(event.item_id, event.event_id, "delete")
        response = self.replies.response
        if response is not None and response[0].turn is turn:
            raise ev.Refusal(event.event_id)(
                f"conversation.item.delete: item {turn.id} is the answer in progress; cancel the response first",
                param="item_id",
            )
        self.ctx.conversation.delete(turn)
        self.ctx.send(ev.ItemDeleted(item_id=turn.id))

    async def item_retrieve(self, event: ev.ConversationItemRetrieve) -> None:
        """The server's view of an item; a spoken user item still held carries its audio (input format)."""
        turn = self._item(event.item_id, event.event_id, "retrieve")
        item = turn.item()
        if turn.audio is not None:
            pcm = float_to_pcm16_bytes(turn.audio)
            item.content[0].audio = base64.b64encode(self.ctx.settings.input_codec.from_pcm16(pcm)).decode()
        self.ctx.send(ev.ItemRetrieved(item=item))
