"""The trojaning attack (Liu et al. 2018, "Trojaning Attack on Neural Networks", NDSS'18).

A white-box attacker holding a trained model but none of its training data makes it answer a
target class whenever a trigger it generated is stamped on an input, in three phases (Sec. IV):

1. **Trojan trigger generation** (Sec. IV-A, Algorithm 1). A mask M (a `Trigger` box: square,
   Apple-like logo or watermark shape; size; transparency, α = 1 − transparency) and one or
   more internal neurons t of a chosen layer: by default those maximising Σ_j |W_{j,t}|, the
   weights from the previous layer j into t (the seed's and the paper's formula,
   `selection="weights"`); `"weights-out"` sums t's outgoing weights to the next layer instead
   (the issue's wording); `"random"` draws them (the paper's "Neuron 11 vs Neuron 81"
   comparison); `"output"` takes the target class's output neuron (the paper's "inner vs
   output neuron" table). The pattern inside M is found by gradient steps on
   cost = Σ_i (tv_i − f_{n_i}(x))², masked by M, on a blank canvas, until cost < threshold or
   the steps run out; tv is `target_value`, or `value_scale` × the largest value the layer
   takes on the attacker's own inputs (the paper drives its neuron from 0 to ~107).
2. **Training data generation** (Sec. IV-B, Algorithm 2, Eqs. 3-5): per class,
   `images_per_class` inputs reverse-engineered from an average of public images (or the mean
   of noise), each start perturbed by Gaussian noise, by model inversion with total-variation
   denoising after each step (`_inversion.invert_classes`, `_inversion.tv_denoise`); each is
   labelled with the original model's prediction.
3. **Retraining** (Sec. IV-C): a copy of the model is fine-tuned on the inverted images (their
   labels) and the same images stamped with the trigger (labelled with the target class); only
   the selected layer and the layers after it are trained, earlier ones are frozen.

`TrojanOutput.phase_seconds` times the three phases as the paper's "time consumption" table
does; `details` holds the neuron values before and after trigger generation (the paper's
"Neuron value" row). The target model is never modified: its gradients are taken with
`torch.autograd.grad` (no `.grad` written) and retraining works on a deep copy.
"""

from __future__ import annotations

import copy
import time
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from privacylab.attacks.poisoning._inversion import invert_classes
from privacylab.attacks.poisoning.base import (
    ModelTrojanAttack,
    PoisonError,
    TrojanOutput,
    TrojanTask,
    number_option,
    register_backdoor,
    whole_option,
)
from privacylab.attacks.poisoning.trigger import Trigger, TriggerError, parse_trigger
from privacylab.target import Target

__all__ = ["SELECTIONS", "Trojan", "hidden_layer", "select_neurons"]

SELECTIONS = ("weights", "weights-out", "random", "output")
NAME = "trojan"


def _fail(message: str) -> PoisonError:
    return PoisonError(f"{NAME}: {message}")


def _linears(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]


def hidden_layer(model: nn.Module) -> str:
    """The default layer: the hidden `nn.Linear` feeding the last `nn.Linear` (the
    second-to-last Linear in `named_modules` order; Liu et al. select neurons of an inner
    fully connected layer)."""
    linears = _linears(model)
    if len(linears) < 2:
        raise _fail("the model has no hidden Linear layer before its last one; name a layer")
    return linears[-2]


def _units(module: nn.Module) -> int:
    if isinstance(module, nn.Linear):
        return int(module.out_features)
    if isinstance(module, nn.Conv2d):
        return int(module.out_channels)
    raise _fail(f"neurons are selected in a Linear or Conv2d layer, not {type(module).__name__}")


def _next_weighted(model: nn.Module, layer: str) -> nn.Module:
    names = [n for n, _ in model.named_modules()]
    modules = dict(model.named_modules())
    for name in names[names.index(layer) + 1 :]:
        if isinstance(modules[name], nn.Linear | nn.Conv2d):
            return modules[name]
    raise _fail(f"no Linear or Conv2d layer after {layer!r} for selection='weights-out'")


def _outgoing(model: nn.Module, layer: str, units: int) -> Tensor:
    after = _next_weighted(model, layer)
    weight = after.weight.detach().abs()
    if isinstance(after, nn.Conv2d):
        if after.in_channels != units:
            raise _fail(f"the layer after {layer!r} does not read its {units} channels")
        return weight.sum(dim=(0, 2, 3))
    if after.in_features % units:
        raise _fail(f"the layer after {layer!r} does not read its {units} units")
    return weight.view(after.out_features, units, -1).sum(dim=(0, 2))


def select_neurons(
    model: nn.Module,
    layer: str,
    count: int,
    selection: str,
    generator: torch.Generator | None = None,
) -> tuple[int, ...]:
    """The `count` neurons of `layer` (units of a Linear, channels of a Conv2d) to drive
    (Liu et al. 2018, Sec. IV-A "Internal neuron selection"): `weights`, the largest
    Σ_j |W_{j,t}| over the weights from the previous layer j into t (for a Conv2d, over input
    channels and kernel positions); `weights-out`, the largest sum of t's outgoing weights to
    the next Linear/Conv2d layer; `random`, drawn with `generator`. Ties go to the lower
    index; the result is sorted by score, best first (by draw for `random`)."""
    modules = dict(model.named_modules())
    if layer not in modules:
        raise _fail(f"no layer named {layer!r} in the model")
    module = modules[layer]
    units = _units(module)
    if count > units:
        raise _fail(f"neurons={count} but layer {layer!r} has {units}")
    if selection == "random":
        return tuple(int(i) for i in torch.randperm(units, generator=generator)[:count])
    if selection == "weights":
        scores = module.weight.detach().abs().flatten(1).sum(dim=1)
    elif selection == "weights-out":
        scores = _outgoing(model, layer, units)
    else:
        raise _fail(f"unknown selection {selection!r}; choose one of {', '.join(SELECTIONS)}")
    order = sorted(range(units), key=lambda i: (-float(scores[i]), i))
    return tuple(order[:count])


def _neuron_values(output: Tensor, neurons: tuple[int, ...]) -> Tensor:
    """(n, k) values of the neurons: a Linear unit's output, a Conv2d channel's mean."""
    picked = output[:, list(neurons)]
    return picked.flatten(2).mean(dim=2) if picked.dim() > 2 else picked


def _option(name: str, value: object, low: int = 1) -> int:
    return whole_option(NAME, name, value, low)


def _number(name: str, value: object, *, zero: bool = False) -> float:
    return number_option(NAME, name, value, zero=zero)


@register_backdoor
class Trojan(ModelTrojanAttack):
    """Liu et al. 2018's trojaning attack (see the module docstring).

    `layer`: the module (a name in `named_modules`) whose neurons are driven; None: the
    hidden Linear feeding the last Linear (`selection="output"`: the last Linear itself).
    `neurons`: how many (an int, or "all"); `selection` in `SELECTIONS`. `trigger`: the mask
    box (`square`/`logo`/`watermark`; SIZE; a fixed position; `:OPACITY` = 1 − transparency).
    Trigger generation: `target_value` (None: `value_scale` × the layer's largest value on the
    attacker's inputs, at least `value_scale`), `trigger_steps`, `trigger_lr`, stop when the
    cost < `trigger_threshold` × Σ tv². Data generation: `images_per_class`, `inversion_steps`,
    `inversion_lr`, `inversion_value` (the probability aimed at), `init_average` (how many
    public images each initial state averages; None: all of them, the paper's one average —
    a few keep the inverted images of a class apart, which retraining needs to keep the
    clean accuracy), `init_noise` (Gaussian spread added to each initial state), `denoise` with
    `tv_weight` (λ of Eq. 5) and `tv_iterations`. Retraining: `retrain_epochs`,
    `retrain_batch`, `lr`. `seed` fixes every draw."""

    name: ClassVar[str] = NAME

    def __init__(
        self,
        layer: str | None = None,
        neurons: int | str = 1,
        selection: str = "weights",
        trigger: str | Trigger = "square:7@corner",
        target_value: float | None = None,
        value_scale: float = 10.0,
        trigger_steps: int = 300,
        trigger_lr: float = 0.05,
        trigger_threshold: float = 1e-4,
        images_per_class: int = 20,
        inversion_steps: int = 200,
        inversion_lr: float = 0.05,
        inversion_value: float = 1.0,
        init_noise: float = 0.2,
        init_average: int | None = 1,
        denoise: bool = True,
        tv_weight: float = 0.02,
        tv_iterations: int = 10,
        retrain_epochs: int = 30,
        retrain_batch: int = 64,
        lr: float = 1e-2,
        seed: int = 0,
    ) -> None:
        if selection not in SELECTIONS:
            raise _fail(f"unknown selection {selection!r}; choose one of {', '.join(SELECTIONS)}")
        if layer is not None and (not isinstance(layer, str) or not layer):
            raise _fail(f"layer must be a module name, got {layer!r}")
        if layer is not None and selection == "output":
            raise _fail("selection='output' uses the last Linear layer; leave layer unset")
        if neurons != "all":
            _option("neurons", neurons)
        if selection == "output" and neurons != 1:
            raise _fail("selection='output' drives the one output neuron of the target class")
        try:
            self.trigger = parse_trigger(trigger)
        except TriggerError as error:
            raise _fail(str(error)) from None
        if self.trigger.position == "random":
            raise _fail("the trojan trigger is generated at one place: give corner or ROW,COL")
        if self.trigger.shape == "pattern":
            raise _fail("the trojan trigger's mask is square, logo or watermark, not pattern")
        if target_value is not None:
            _number("target_value", target_value)
        if not 0.0 < _number("inversion_value", inversion_value) <= 1.0:
            raise _fail(f"inversion_value is a probability in (0, 1], got {inversion_value!r}")
        if not isinstance(denoise, bool):
            raise _fail(f"denoise must be true or false, got {denoise!r}")
        self.layer = layer
        self.neurons = neurons
        self.selection = selection
        self.target_value = None if target_value is None else float(target_value)
        self.value_scale = _number("value_scale", value_scale)
        self.trigger_steps = _option("trigger_steps", trigger_steps)
        self.trigger_lr = _number("trigger_lr", trigger_lr)
        self.trigger_threshold = _number("trigger_threshold", trigger_threshold, zero=True)
        self.images_per_class = _option("images_per_class", images_per_class)
        self.inversion_steps = _option("inversion_steps", inversion_steps)
        self.inversion_lr = _number("inversion_lr", inversion_lr)
        self.inversion_value = float(inversion_value)
        self.init_noise = _number("init_noise", init_noise, zero=True)
        self.init_average = None if init_average is None else _option("init_average", init_average)
        self.denoise = denoise
        self.tv_weight = _number("tv_weight", tv_weight)
        self.tv_iterations = _option("tv_iterations", tv_iterations)
        self.retrain_epochs = _option("retrain_epochs", retrain_epochs)
        self.retrain_batch = _option("retrain_batch", retrain_batch)
        self.lr = _number("lr", lr)
        self.seed = _option("seed", seed, 0)

    # ------------------------------------------------------------------------------ checks

    def _check_task(self, task: TrojanTask) -> None:
        shape = tuple(task.input_shape)
        try:
            self.trigger.check(shape)
        except TriggerError as error:
            raise _fail(str(error)) from None
        if not 0 <= int(task.target_class) < int(task.num_classes):
            raise _fail(f"target class must be in [0, {task.num_classes}), got {task.target_class}")
        if task.public is not None and (
            task.public.dim() != 4 or tuple(task.public.shape[1:]) != shape or not len(task.public)
        ):
            raise _fail(f"public images must be (n, {', '.join(map(str, shape))}), n >= 1")

    def _layer(self, net: nn.Module) -> str:
        if self.selection == "output":
            linears = _linears(net)
            if not linears:
                raise _fail("the model has no Linear output layer")
            return linears[-1]
        layer = hidden_layer(net) if self.layer is None else self.layer
        if layer not in dict(net.named_modules()):
            raise _fail(f"no layer named {layer!r} in the model")
        return layer

    # ------------------------------------------------------------------------------ phases

    def _bases(self, task: TrojanTask, generator: torch.Generator, device: torch.device) -> Tensor:
        """The attacker's own inputs: its public images, else uniform noise."""
        if task.public is not None:
            return task.public.float().to(device)
        return torch.rand((64, *task.input_shape), generator=generator).to(device)

    def _generate_trigger(
        self,
        model: nn.Module,
        probe: _Probe,
        neurons: tuple[int, ...],
        task: TrojanTask,
        generator: torch.Generator,
        bases: Tensor,
    ) -> tuple[Trigger, dict[str, Any]]:
        """Algorithm 1: gradient steps on the pattern inside M towards the target values."""
        device = bases.device
        with torch.no_grad():
            observed = float(probe.output(model, bases).max())
        value = self.target_value
        if value is None:
            value = self.value_scale * max(observed, 1.0)
        channels = task.input_shape[0]
        size = self.trigger.size
        place = self.trigger.places(1, tuple(task.input_shape))
        blank = torch.zeros((1, *task.input_shape), device=device)
        pattern = torch.rand((channels, size, size), generator=generator).to(device)
        pattern.requires_grad_(True)
        optimizer = torch.optim.Adam([pattern], lr=self.trigger_lr)
        goal = torch.full((len(neurons),), value, device=device)
        stop = self.trigger_threshold * float((goal**2).sum())

        with torch.no_grad():
            before = self._neuron(model, probe, pattern, blank, place, neurons)
        cost = torch.tensor(float("inf"))
        steps = 0
        while steps < self.trigger_steps:
            steps += 1
            current = self._neuron(model, probe, pattern, blank, place, neurons)
            cost = ((goal - current) ** 2).sum()
            if float(cost.detach()) < stop:
                break
            (grad,) = torch.autograd.grad(cost, pattern)
            pattern.grad = grad
            optimizer.step()
            with torch.no_grad():
                pattern.clamp_(0, 1)
        learned = pattern.detach() * self.trigger.box_mask().to(device)
        trigger = self.trigger.with_pattern(learned)
        with torch.no_grad():
            after = self._neuron(model, probe, learned, blank, place, neurons)
        info = {
            "target_value": value,
            "layer_max_on_own_inputs": observed,
            "neuron_value_before": before.tolist(),
            "neuron_value_after": after.tolist(),
            "trigger_cost": float(cost.detach()),
            "trigger_steps_run": steps,
        }
        return trigger, info

    def _stamp(self, pattern: Tensor, images: Tensor, place: Tensor) -> Tensor:
        """x' = (1 − α m) ⊙ x + α m ⊙ p in the box, differentiable in `pattern`."""
        mask = (self.trigger.alpha * self.trigger.box_mask()).to(images)
        row, col = (int(v) for v in place[0])
        size = self.trigger.size
        canvas = torch.zeros_like(images[:1]).repeat(len(images), 1, 1, 1)
        weight = torch.zeros_like(images[0, 0])
        weight[row : row + size, col : col + size] = mask
        canvas[:, :, row : row + size, col : col + size] = pattern.expand(
            len(images), *pattern.shape
        )
        return (1 - weight) * images + weight * canvas

    def _neuron(
        self,
        model: nn.Module,
        probe: _Probe,
        pattern: Tensor,
        blank: Tensor,
        place: Tensor,
        neurons: tuple[int, ...],
    ) -> Tensor:
        return _neuron_values(probe.output(model, self._stamp(pattern, blank, place)), neurons)[0]

    def generate_data(
        self, model: nn.Module, task: TrojanTask, generator: torch.Generator, device: torch.device
    ) -> tuple[Tensor, Tensor, dict[str, Any]]:
        """Algorithm 2 for `images_per_class` images of every class; labels = the original
        model's predictions."""
        k = self.images_per_class
        classes = torch.arange(task.num_classes).repeat_interleave(k).to(device)
        n = len(classes)
        if task.public is not None:
            public = task.public.float().cpu()
            if self.init_average is None or self.init_average >= len(public):
                start = public.mean(dim=0, keepdim=True)
            else:
                rows = torch.stack(
                    [
                        torch.randperm(len(public), generator=generator)[: self.init_average]
                        for _ in range(n)
                    ]
                )
                start = public[rows].mean(dim=1)
        else:
            start = torch.rand((256, *task.input_shape), generator=generator).mean(0, keepdim=True)
        noise = torch.randn((len(classes), *task.input_shape), generator=generator)
        initial = (start + self.init_noise * noise).clamp(0, 1).to(device)
        images, cost = invert_classes(
            model,
            initial,
            classes,
            target_value=self.inversion_value,
            steps=self.inversion_steps,
            lr=self.inversion_lr,
            threshold=1e-4,
            denoise_weight=self.tv_weight if self.denoise else None,
            denoise_iterations=self.tv_iterations,
        )
        with torch.no_grad():
            labels = model(images).argmax(dim=1)
        info = {
            "inversion_cost": float(cost.mean()),
            "inverted_agreement": float((labels == classes).float().mean()),
        }
        return images, labels, info

    def _retrain(
        self,
        net: nn.Module,
        layer: str,
        trigger: Trigger,
        images: Tensor,
        labels: Tensor,
        target_class: int,
        generator: torch.Generator,
    ) -> tuple[nn.Module, list[str]]:
        """Fine-tune a copy from `layer` on: inverted images (their labels) ∪ the same images
        stamped (the target class)."""
        model = copy.deepcopy(net)
        names = [n for n, _ in model.named_modules()]
        start = names.index(layer)
        trained: set[str] = set()
        for position, (name, module) in enumerate(model.named_modules()):
            for pname, param in module.named_parameters(recurse=False):
                full = f"{name}.{pname}" if name else pname
                keep = position >= start
                param.requires_grad_(keep)
                if keep:
                    trained.add(full)
        stamped = trigger.stamp(images)
        x = torch.cat([images, stamped])
        y = torch.cat([labels, torch.full_like(labels, int(target_class))])
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.Adam(params, lr=self.lr)
        model.train()
        for _ in range(self.retrain_epochs):
            order = torch.randperm(len(x), generator=generator).to(x.device)
            for begin in range(0, len(x), self.retrain_batch):
                rows = order[begin : begin + self.retrain_batch]
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
                optimizer.step()
        for param in model.parameters():
            param.requires_grad_(True)
        return model.eval(), sorted(trained)

    # --------------------------------------------------------------------------------- run

    def run(self, target: Target, task: TrojanTask) -> TrojanOutput:
        """The three phases on `target.model` (white-box; every forward pass counted)."""
        self._check_task(task)
        counted = target.model
        net = counted.inner
        device = target.device
        generator = torch.Generator().manual_seed(self.seed)
        layer = self._layer(net)
        units = _units(dict(net.named_modules())[layer])
        count = units if self.neurons == "all" else int(self.neurons)
        if self.selection == "output":
            neurons: tuple[int, ...] = (int(task.target_class),)
            if task.target_class >= units:
                raise _fail(f"the output layer has {units} neurons, no class {task.target_class}")
        else:
            neurons = select_neurons(net, layer, count, self.selection, generator)
        probe = _Probe(net, layer)
        clock = time.perf_counter()
        bases = self._bases(task, generator, device)
        try:
            trigger, trigger_info = self._generate_trigger(
                counted, probe, neurons, task, generator, bases
            )
        finally:
            probe.close()
        trigger_seconds = time.perf_counter() - clock
        clock = time.perf_counter()
        images, labels, data_info = self.generate_data(counted, task, generator, device)
        data_seconds = time.perf_counter() - clock
        clock = time.perf_counter()
        model, trained = self._retrain(
            net, layer, trigger, images, labels, task.target_class, generator
        )
        retrain_seconds = time.perf_counter() - clock
        _, height, width = task.input_shape
        details = {
            "selection": self.selection,
            "mask": trigger.full_mask(tuple(task.input_shape)).tolist(),
            "transparency": 1.0 - trigger.alpha,
            "mask_area": float(trigger.box_mask().sum()) / float(height * width),
            "denoise": self.denoise,
            "retrained": trained,
            "public_images": 0 if task.public is None else len(task.public),
            **trigger_info,
            **data_info,
        }
        return TrojanOutput(
            model=model,
            trigger=trigger,
            inverted=images.cpu(),
            inverted_labels=labels.cpu(),
            layer=layer,
            neurons=neurons,
            phase_seconds={
                "trigger_generation": trigger_seconds,
                "data_generation": data_seconds,
                "retraining": retrain_seconds,
            },
            details=details,
        )


class _Probe:
    """A forward hook that keeps the output of one layer of the model's last forward pass."""

    def __init__(self, net: nn.Module, layer: str) -> None:
        self.value: Tensor | None = None
        module = dict(net.named_modules())[layer]
        self.handle = module.register_forward_hook(self._keep)

    def _keep(self, _module: nn.Module, _inputs: Any, output: Any) -> None:
        self.value = output[0] if isinstance(output, tuple) else output

    def output(self, model: nn.Module, x: Tensor) -> Tensor:
        """The layer's output for `x` (one forward pass of `model`)."""
        model(x)
        assert self.value is not None
        value, self.value = self.value, None
        return value

    def close(self) -> None:
        self.handle.remove()
